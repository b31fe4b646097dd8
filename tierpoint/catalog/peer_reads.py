"""What the node data endpoint and peer copies read from the catalog: which files a node serves,
and where each node serves them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from tierpoint.config import TierConfig, TierKind
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

from .models import Checkpoint, Job, Node, Replica, Shard


def served_size(
    session: Session, node: str, tier: str, job: str, step: int, path: str
) -> int | None:
    """The size of the shard `path` of `job`/`step` if `node` holds a verified copy of it on
    `tier`, else None: the data endpoint serves registered, verified files only."""
    size: int | None = session.scalar(
        select(Shard.size)
        .join(Checkpoint, Checkpoint.id == Shard.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .join(Replica, Replica.shard_id == Shard.id)
        .where(
            Job.name == job,
            Checkpoint.step == step,
            Shard.path == path,
            Replica.tier == tier,
            Replica.node_id == node,
            Replica.state == ReplicaState.VERIFIED.value,
        )
    )
    return size


def _data_urls(node_ids: Iterable[str]) -> Any:
    return select(Node.id, Node.data_url).where(
        Node.id.in_(sorted(set(node_ids))),
        Node.data_url.is_not(None),
        Node.lost_at.is_(None),
    )


def data_urls(session: Session, node_ids: Iterable[str]) -> dict[str, str]:
    """Each node's data endpoint, for the nodes that serve one and are not declared lost."""
    return {r.id: r.data_url for r in session.execute(_data_urls(node_ids))}


async def adata_urls(session: AsyncSession, node_ids: Iterable[str]) -> dict[str, str]:
    """`data_urls` for the API."""
    return {r.id: r.data_url for r in await session.execute(_data_urls(node_ids))}


def peer_url(
    tier: TierConfig | None, urls: dict[str, str], node: str | None, job: str, step: int, path: str
) -> str | None:
    """Where a restore reads a peer tier's copy held by `node` (None: not a peer copy, or its
    node serves no endpoint)."""
    if tier is None or tier.kind is not TierKind.PEER or node is None or node not in urls:
        return None
    return shard_url(urls[node], tier.name, ShardRef(job, step, path))
