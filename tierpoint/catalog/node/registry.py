"""Nodes as their workers report them in (local roots, data endpoint, failure domain), and the
facts the rest of the catalog asks about them: known, declared lost, serving their queues. The
API accepts shards only on known nodes that are not lost; declaring a node lost is
`tier_copy/node_lost.py`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, exists, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from tierpoint.catalog.locks import RowLock, lock_in_order
from tierpoint.catalog.models import Node
from tierpoint.errors import UnknownNode
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url
from tierpoint.tier_config import TierConfig, TierKind


def all_seen_since(session: Session, node_ids: Sequence[str], since: datetime) -> bool:
    """Every one of `node_ids` has reported in at or after `since` (the catalog's clock)."""
    seen = session.scalar(
        select(func.count()).where(Node.id.in_(list(node_ids)), Node.last_seen_at >= since)
    )
    return int(seen or 0) == len(set(node_ids))


def upsert_node(
    session: Session,
    node_id: str,
    local_roots: dict[str, Any],
    data_url: str | None = None,
    failure_domain: str | None = None,
) -> None:
    upsert_nodes(session, {node_id: local_roots}, {node_id: data_url}, {node_id: failure_domain})


def upsert_nodes(
    session: Session,
    roots_by_node: Mapping[str, dict[str, Any]],
    data_urls: Mapping[str, str | None] | None = None,
    domains: Mapping[str, str | None] | None = None,
) -> None:
    """Report every one of these nodes in, in one statement (a worker process serving many
    nodes' queues reports them in together), with each node's data endpoint where it serves one
    and its failure domain. Never clears lost_at: a node declared lost stays lost."""
    if not roots_by_node:
        return
    urls = data_urls or {}
    labels = domains or {}
    # Sorted, so two processes reporting overlapping nodes lock their rows in the same order.
    rows = [
        {
            "id": n,
            "local_roots": r,
            "last_seen_at": func.now(),
            "data_url": urls.get(n),
            "failure_domain": labels.get(n),
        }
        for n, r in sorted(roots_by_node.items())
    ]
    stmt = insert(Node).values(rows)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[Node.id],
            set_={
                "local_roots": stmt.excluded.local_roots,
                "last_seen_at": func.now(),
                "failure_domain": stmt.excluded.failure_domain,
                # guard: report-in-keeps-lost
                "data_url": stmt.excluded.data_url,
            },
        )
    )


def failure_domains(session: Session, node_ids: Iterable[str]) -> dict[str, str | None]:
    """node -> the failure domain it reported (None: a domain of its own), for these nodes."""
    wanted = sorted(set(node_ids))
    if not wanted:
        return {}
    rows = session.execute(select(Node.id, Node.failure_domain).where(Node.id.in_(wanted)))
    return {n: d for n, d in rows}


def lost_among(session: Session, node_ids: Iterable[str]) -> list[str]:
    """Which of these nodes are lost. Takes a share lock on their rows until commit, so a caller
    that plans work for them either sees a declaration that committed first or commits before it
    (and `mark_lost` then sees what the caller wrote)."""
    # guard: lost-among-share-lock
    return lock_in_order(session, nodes=node_ids, node_lock=RowLock.SHARE).lost_nodes


def require_known(session: Session, node_id: str) -> None:
    """UnknownNode unless a worker of `node_id` has reported in: a reader naming a node nobody
    knows (a typo, another cluster's name) would be answered as if it held no local copies."""
    known = session.scalar(select(exists().where(Node.id == node_id)))
    if not known:
        raise UnknownNode(
            f"node {node_id!r} is unknown: a node is known once its worker has reported in",
            errors=[
                {
                    "field": "node",
                    "location": "query",
                    "message": f"node {node_id!r} is unknown",
                    "code": "unknown_node",
                }
            ],
            extra={"nodes": [node_id]},
        )


def is_lost(session: Session, node_id: str) -> bool:
    return bool(session.scalar(select(Node.lost_at.is_not(None)).where(Node.id == node_id)))


def lost_reason(node: str) -> str:
    return f"node {node} was declared lost: its local copies are gone"


# A node worker reports in every 15 s: one not seen for this long is not serving its queue now.
NODE_SEEN_WITHIN = timedelta(minutes=5)


def serving_nodes(session: Session) -> list[str]:
    """The nodes serving their queues: not declared lost, and reported in lately."""
    return list(
        session.scalars(
            select(Node.id)
            .where(Node.lost_at.is_(None), Node.last_seen_at > func.now() - NODE_SEEN_WITHIN)
            .order_by(Node.id)
        )
    )


def known_count(session: Session | Connection) -> int:
    """How many nodes have ever reported in, the ones declared lost included: the size of the
    cluster that configuration is checked against (a loss is not a configuration error)."""
    return int(session.scalar(select(func.count()).select_from(Node)) or 0)


async def known_count_async(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return await conn.run_sync(known_count)


def lost_nodes(session: Session, nodes: Sequence[str]) -> set[str]:
    """Which of these nodes are declared lost (no lock: see `lost_among` for one)."""
    return set(
        session.scalars(select(Node.id).where(Node.id.in_(list(nodes)), Node.lost_at.is_not(None)))
    )


def _data_urls(node_ids: Iterable[str]) -> Any:
    return select(Node.id, Node.data_url).where(
        Node.id.in_(sorted(set(node_ids))),
        Node.data_url.is_not(None),
        Node.lost_at.is_(None),
    )


def data_urls(session: Session, node_ids: Iterable[str]) -> dict[str, str]:
    """Each node's data endpoint, for the nodes that serve one and are not declared lost."""
    return {r.id: r.data_url for r in session.execute(_data_urls(node_ids))}


def peer_url(
    tier: TierConfig | None,
    urls: dict[str, str],
    node: str | None,
    job: str,
    step: int,
    path: str,
    branch: int = 1,
) -> str | None:
    """Where a restore reads a peer tier's copy held by `node` (None: not a peer copy, or its
    node serves no endpoint)."""
    if tier is None or tier.kind is not TierKind.PEER or node is None or node not in urls:
        return None
    return shard_url(urls[node], tier.name, ShardRef(job, step, path, branch))
