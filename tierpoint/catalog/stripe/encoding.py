"""What a node's encoder reads from the catalog: the sealed shards of a checkpoint it cuts into
stripes, with the stripes already placed for each; and what its staging area may hold.

The encoder names each stripe's file after its shard, so a job's stripes are found by those names
here (`of_job`, `named_size`), for the staging area and for the holders' reads alike."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import undeleted_checkpoint_name
from tierpoint.catalog.models import Checkpoint, Job, Replica, Shard, Stripe
from tierpoint.states import ReplicaState
from tierpoint.storage.base import RecordedCopy
from tierpoint.storage.paths import step_dir

# A staged stripe is served to its holder while it is placed and not yet given up.
PULLABLE = [
    ReplicaState.PENDING.value,
    ReplicaState.COPYING.value,
    ReplicaState.VERIFIED.value,
    ReplicaState.CORRUPT.value,
]


@dataclass(frozen=True)
class Placed:
    """A stripe the catalog already records: its holder and what the encoder cut."""

    node: str
    size: int
    crc32c: str


@dataclass(frozen=True)
class ToEncode:
    """A shard of the node, sealed on its local tier, and its stripes already placed."""

    shard_id: int
    path: str
    size: int
    crc32c: str
    placed: dict[int, Placed] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodeSet:
    job: str
    step: int
    branch: int
    shards: list[ToEncode]


def to_encode(
    session: Session,
    checkpoint_id: int,
    node: str,
    local_tier: str,
    coded_tier: str,
    ordinals: tuple[int, int],
) -> EncodeSet | None:
    """The checkpoint's shards on `node` with manifest ordinals in [first, last] whose copy on
    `local_tier` is sealed (verified), in ordinal order; None if the checkpoint is not in the
    catalog.
    A shard not sealed is left out: the encoder reads only bytes the catalog verified."""
    head = undeleted_checkpoint_name(session, checkpoint_id)
    if head is None:
        return None
    q = (
        select(Shard.id, Shard.path, Shard.size, Shard.checksum)
        .join(Replica, Replica.shard_id == Shard.id)
        .where(
            Shard.checkpoint_id == checkpoint_id,
            Shard.node_id == node,
            Shard.ordinal.between(*ordinals),
            Shard.checksum.is_not(None),
            Replica.tier == local_tier,
            Replica.state == ReplicaState.VERIFIED.value,
        )
        .order_by(Shard.ordinal)
    )
    shards = [
        ToEncode(sid, path, size, checksum or "")
        for sid, path, size, checksum in session.execute(q)
    ]
    if shards:
        rows = session.execute(
            select(
                Stripe.shard_id, Stripe.stripe_index, Stripe.node_id, Stripe.size, Stripe.crc32c
            ).where(Stripe.tier == coded_tier, Stripe.shard_id.in_([s.shard_id for s in shards]))
        )
        by_id = {s.shard_id: s for s in shards}
        for sid, index, holder, size, crc in rows:
            by_id[sid].placed[index] = Placed(holder, size, crc)
    return EncodeSet(head.job, head.step, head.branch, shards)


def of_job(*columns: Any, job: str, tier: str) -> Select[Any]:
    """`columns` of `job`'s stripes on `tier`, joined to the names their files lie at (the
    checkpoint's step and branch, the shard's path): what a staging area, a holder's root and a
    data endpoint are checked against. The callers say whose stripes and in which states."""
    return (
        select(*columns)
        .join(Shard, Shard.id == Stripe.shard_id)
        .join(Checkpoint, Checkpoint.id == Stripe.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.name == job, Stripe.tier == tier)
    )


def named_size(
    *, job: str, step: int, branch: int, path: str, tier: str, index: int
) -> Select[int]:
    """The size of stripe `index` of the file at `path` of `job`'s checkpoint `step` on `branch`
    (not deleted) on `tier`: the stripe a data endpoint is asked for by name."""
    size: Select[int] = of_job(Stripe.size, job=job, tier=tier)
    return size.where(
        Checkpoint.step == step,
        Checkpoint.branch == branch,
        Checkpoint.deleted_at.is_(None),
        Shard.path == path,
        Stripe.stripe_index == index,
    )


def staged_names(session: Session, node: str, tier: str, job: str) -> set[tuple[int, str, str]]:
    """(stripe index, checkpoint directory, shard path) of every stripe of `job`'s shards on
    `node` that the catalog records on `tier` and has not expired: the names a staging area of
    that node may hold for the job."""
    rows = session.execute(
        of_job(
            Stripe.stripe_index, Checkpoint.step, Checkpoint.branch, Shard.path, job=job, tier=tier
        ).where(Shard.node_id == node, Stripe.state != ReplicaState.EXPIRED.value)
    )
    return {(index, step_dir(step, branch), path) for index, step, branch, path in rows}


def staged_copies(
    session: Session,
    checkpoint_id: int,
    tier: str,
    node: str,
    shards: Collection[int] | None = None,
) -> dict[int, list[RecordedCopy]]:
    """Stripe index -> the checkpoint's stripes on `tier` of `node`'s shards (only `shards`
    when given) as the encoder recorded them (each shard's path, the stripe's size and crc32c):
    what may be deleted from the node's staging area, and nothing else."""
    q = (
        select(Stripe.stripe_index, Shard.path, Stripe.size, Stripe.crc32c)
        .join(Shard, Shard.id == Stripe.shard_id)
        .where(Stripe.checkpoint_id == checkpoint_id, Stripe.tier == tier, Shard.node_id == node)
        .order_by(Shard.ordinal, Stripe.stripe_index)
    )
    if shards is not None:
        q = q.where(Shard.id.in_(list(shards)))
    rows = session.execute(q)
    out: dict[int, list[RecordedCopy]] = {}
    for index, path, size, crc in rows:
        out.setdefault(index, []).append(RecordedCopy(path, size, crc))
    return out


def staged_size(
    session: Session, node: str, tier: str, index: int, job: str, step: int, branch: int, path: str
) -> int | None:
    """The size the encoder recorded for stripe `index` of `node`'s shard `path`, while the
    catalog has it placed there for its holder to pull (not lost, not expiring or expired);
    None for anything else."""
    return session.scalar(
        named_size(job=job, step=step, branch=branch, path=path, tier=tier, index=index).where(
            Shard.node_id == node,
            # guard: staged-stripe-served-while-placed
            Stripe.state.in_(PULLABLE),
        )
    )
