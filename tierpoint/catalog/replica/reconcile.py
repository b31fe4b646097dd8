"""Catalog side of reconciliation: what the catalog says one job has on one tier (and node), to
compare with what a listing of the tier finds."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import CachedCopy, Checkpoint, Job, Replica, Shard
from tierpoint.storage.paths import step_dir


@dataclass(frozen=True)
class Expected:
    shard_size: int
    replica_id: int | None
    replica_state: str | None


def job_on_tier(
    session: Session, job: str, tier: str, node: str | None, holder: str | None = None
) -> dict[tuple[str, str], Expected]:
    """(checkpoint directory, shard path) -> the shard's size and its replica on the tier, for
    every shard of the job's checkpoints (on a local tier: the shards of `node` and those a
    reader keeps a copy of there; on a peer tier: the shards whose copy `holder` holds). A file
    under such a name is known to the catalog whatever its replica says (e.g. a local shard not
    sealed yet)."""
    q = (
        select(
            Checkpoint.step, Checkpoint.branch, Shard.path, Shard.size, Replica.id, Replica.state
        )
        .join(Job, Job.id == Checkpoint.job_id)
        .join(Shard, Shard.checkpoint_id == Checkpoint.id)
        .outerjoin(Replica, and_(Replica.shard_id == Shard.id, Replica.tier == tier))
        .where(Job.name == job)
    )
    if node is not None:
        q = q.where(Shard.node_id == node)
    if holder is not None:
        # A copy another node held before (re-replication moved its row) is not this node's.
        q = q.where(Replica.node_id == holder)
    expected = {
        (step_dir(step, branch), path): Expected(size, rid, state)
        for step, branch, path, size, rid, state in session.execute(q)
    }
    if node is not None:
        # Files a reader keeps on the node (another node's, which it loaded) are known too.
        cached = (
            select(Checkpoint.step, Checkpoint.branch, Shard.path, Shard.size)
            .join(Job, Job.id == Checkpoint.job_id)
            .join(CachedCopy, CachedCopy.checkpoint_id == Checkpoint.id)
            .join(Shard, Shard.id == CachedCopy.shard_id)
            .where(Job.name == job, CachedCopy.tier == tier, CachedCopy.node_id == node)
        )
        for step, branch, path, size in session.execute(cached):
            expected.setdefault((step_dir(step, branch), path), Expected(size, None, None))
    return expected
