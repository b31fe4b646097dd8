"""A checkpoint's shards as the lifecycle's activities read them: ordinals by node (the input of
batching), one batch's shards with their replicas on the tiers a copy reads and writes, and the
checksums a seal computed for shards registered without one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sqlalchemy import Executable, Table, and_, bindparam, null, select, update
from sqlalchemy.orm import Session, aliased

from tierpoint.catalog.models import Checkpoint, Replica, Shard, TierCopy
from tierpoint.storage.s3.layout import KeyLayout

_shard_table = cast(Table, Shard.__table__)


@dataclass(frozen=True)
class BatchShard:
    id: int
    ordinal: int
    path: str
    size: int
    checksum: str | None
    node_id: str
    source_state: str | None  # replica state on the source tier (None: no replica)
    state: str | None  # replica state on the tier being written (None: no replica yet)


@dataclass(frozen=True)
class BatchCheckpoint:
    """What a batch activity needs of its checkpoint besides the shards."""

    job_id: int | None  # None: the checkpoint is gone
    branch: int  # the job's branch it was saved on: its directory on every tier
    layouts: dict[str, KeyLayout]  # the key layout of its copy on each tier with a tier copy


def batch_checkpoint(session: Session, checkpoint_id: int) -> BatchCheckpoint:
    """The checkpoint's job, branch and key layouts in one statement: a storm of tiny
    checkpoints pays per round trip (`key_layouts.of_checkpoint` says what a layout is)."""
    rows = session.execute(
        select(Checkpoint.job_id, Checkpoint.branch, TierCopy.tier, TierCopy.key_layout)
        .outerjoin(TierCopy, TierCopy.checkpoint_id == Checkpoint.id)
        .where(Checkpoint.id == checkpoint_id)
    ).all()
    if not rows:
        return BatchCheckpoint(job_id=None, branch=1, layouts={})
    branch = rows[0].branch
    return BatchCheckpoint(
        job_id=rows[0].job_id,
        branch=1 if branch is None else int(branch),
        layouts={r.tier: KeyLayout.parse(r.key_layout) for r in rows if r.tier is not None},
    )


def checkpoint_branch(session: Session, checkpoint_id: int) -> int:
    """The branch the checkpoint was saved on, which names its directory on every tier."""
    branch = session.scalar(select(Checkpoint.branch).where(Checkpoint.id == checkpoint_id))
    return 1 if branch is None else int(branch)


def shard_ordinals_by_node(session: Session, checkpoint_id: int) -> list[tuple[str, int, int]]:
    """(node, ordinal, size) of every shard, ordered by node then ordinal: the input of
    batching."""
    rows = session.execute(
        select(Shard.node_id, Shard.ordinal, Shard.size)
        .where(Shard.checkpoint_id == checkpoint_id)
        .order_by(Shard.node_id, Shard.ordinal)
    )
    return [(n, o, size) for n, o, size in rows]


# The batch's shards with their replica on the tier being copied to (and on its source tier):
# built once, as building a select over aliases costs more than running it.
_DST = aliased(Replica, name="dst")


_SRC = aliased(Replica, name="src")


def _batch_shards_stmt(with_source: bool) -> Executable:
    stmt = (
        select(
            Shard.id,
            Shard.ordinal,
            Shard.path,
            Shard.size,
            Shard.checksum,
            Shard.node_id,
            _SRC.state if with_source else null(),
            _DST.state,
        )
        .outerjoin(_DST, and_(_DST.shard_id == Shard.id, _DST.tier == bindparam("tier")))
        .where(
            Shard.checkpoint_id == bindparam("checkpoint_id"),
            Shard.node_id == bindparam("node"),
            Shard.ordinal.between(bindparam("first"), bindparam("last")),
        )
        .order_by(Shard.ordinal)
    )
    if with_source:
        stmt = stmt.outerjoin(
            _SRC, and_(_SRC.shard_id == Shard.id, _SRC.tier == bindparam("source_tier"))
        )
    return stmt


_BATCH_SHARDS = {True: _batch_shards_stmt(True), False: _batch_shards_stmt(False)}


def batch_shards(
    session: Session,
    checkpoint_id: int,
    node: str,
    first: int,
    last: int,
    tier: str,
    source_tier: str | None = None,
) -> list[BatchShard]:
    params = {"checkpoint_id": checkpoint_id, "node": node, "first": first, "last": last}
    params |= {"tier": tier, "source_tier": source_tier}
    stmt = _BATCH_SHARDS[source_tier is not None]
    return [BatchShard(*row) for row in session.execute(stmt, params)]


def fill_checksums(session: Session, checksums: dict[int, str]) -> None:
    """Record checksums computed at seal for shards registered without one."""
    if not checksums:
        return
    session.connection().execute(
        update(_shard_table)
        .where(_shard_table.c.id == bindparam("sid"), _shard_table.c.checksum.is_(None))
        .values(checksum=bindparam("crc")),
        [{"sid": sid, "crc": crc} for sid, crc in checksums.items()],
    )
