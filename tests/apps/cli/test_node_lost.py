"""`tierpoint node-lost NODE` against the real API, as an operator runs it."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token
from tierpoint.catalog.nodes import upsert_node


async def _run(api_url: str, token: str, *args: str) -> tuple[int, str]:
    r = await run_cli(api_url, "node-lost", *args, token=token)
    return r.exit_code, r.output


async def test_node_lost_declares_once_then_reports_it_was_lost(
    api_url: str, catalog: Engine
) -> None:
    node = f"node-{uuid.uuid4().hex[:10]}"
    with Session(catalog) as s:
        upsert_node(s, node, {})
        s.commit()

    bob = create_token(catalog, "ops-bob", ["operate"])
    code, out = await _run(api_url, bob, node)
    assert code == 0, out
    assert f"node {node} declared lost" in out
    code, out = await _run(api_url, bob, node)
    assert code == 0, out
    assert f"node {node} was lost already" in out
    with catalog.connect() as conn:
        actors = conn.scalars(
            text(
                "SELECT actor FROM event WHERE kind = 'node_lost' AND detail->>'node' = :n "
                "AND checkpoint_id IS NULL"
            ),
            {"n": node},
        ).all()
    assert actors == ["ops-bob"]

    code, out = await _run(api_url, bob, "never-reported-in")
    assert code == 1
    assert "node_not_found" in out
