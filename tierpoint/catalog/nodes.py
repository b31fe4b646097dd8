"""Nodes report in through their workers; the API accepts shards only on known nodes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from .models import Node


def upsert_node(session: Session, node_id: str, local_roots: dict[str, Any]) -> None:
    stmt = insert(Node).values(id=node_id, local_roots=local_roots, last_seen_at=func.now())
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[Node.id],
            set_={"local_roots": stmt.excluded.local_roots, "last_seen_at": func.now()},
        )
    )
