"""What a holder reads from the catalog to pull its stripes: those placed on it of one node's
shards in a batch, with what the encoder recorded of each."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import undeleted_checkpoint_name
from tierpoint.catalog.models import Checkpoint, Shard, Stripe
from tierpoint.catalog.stripe.encoding import of_job
from tierpoint.states import ReplicaState
from tierpoint.storage.base import RecordedCopy
from tierpoint.storage.paths import step_dir


@dataclass(frozen=True)
class ToPull:
    shard_id: int
    index: int
    path: str
    size: int
    crc32c: str
    state: str


@dataclass(frozen=True)
class PullSet:
    job: str
    step: int
    branch: int
    stripes: list[ToPull]


def to_pull(
    session: Session,
    checkpoint_id: int,
    tier: str,
    node: str,
    holder: str,
    ordinals: tuple[int, int],
) -> PullSet | None:
    """The stripes on `tier` placed on `holder` of `node`'s shards with manifest ordinals in
    [first, last], not lost nor expiring, in ordinal order; None if the checkpoint is gone."""
    head = undeleted_checkpoint_name(session, checkpoint_id)
    if head is None:
        return None
    rows = session.execute(
        select(
            Stripe.shard_id,
            Stripe.stripe_index,
            Shard.path,
            Stripe.size,
            Stripe.crc32c,
            Stripe.state,
        )
        .join(Shard, Shard.id == Stripe.shard_id)
        .where(
            Stripe.checkpoint_id == checkpoint_id,
            Stripe.tier == tier,
            Stripe.node_id == holder,
            Shard.node_id == node,
            Shard.ordinal.between(*ordinals),
            Stripe.state.in_(
                [
                    ReplicaState.PENDING.value,
                    ReplicaState.COPYING.value,
                    ReplicaState.VERIFIED.value,
                    ReplicaState.CORRUPT.value,
                ]
            ),
        )
        .order_by(Shard.ordinal)
    )
    return PullSet(head.job, head.step, head.branch, [ToPull(*r) for r in rows])


@dataclass(frozen=True)
class Held:
    shard_id: int
    index: int
    size: int
    state: str


def held_stripes(session: Session, holder: str, tier: str, job: str) -> dict[tuple[str, str], Held]:
    """(checkpoint directory, shard path) -> the stripe of it that `holder` holds on `tier`, for
    `job`'s checkpoints (not expired): the names its root of the tier may hold for the job."""
    rows = session.execute(
        of_job(
            Checkpoint.step,
            Checkpoint.branch,
            Shard.path,
            Stripe.shard_id,
            Stripe.stripe_index,
            Stripe.size,
            Stripe.state,
            job=job,
            tier=tier,
        ).where(Stripe.node_id == holder, Stripe.state != ReplicaState.EXPIRED.value)
    )
    return {
        (step_dir(step, branch), path): Held(sid, index, size, state)
        for step, branch, path, sid, index, size, state in rows
    }


def found_bad_on(session: Session, holder: str, tier: str, job: str) -> list[int]:
    """The checkpoints of `job` with a stripe on `tier` that `holder` holds and that was found
    bad there (`corrupt` or `lost`): what its rebuild cuts again."""
    rows = session.scalars(
        of_job(Stripe.checkpoint_id, job=job, tier=tier)
        .where(
            Stripe.node_id == holder,
            Stripe.state.in_([ReplicaState.CORRUPT.value, ReplicaState.LOST.value]),
        )
        .distinct()
        .order_by(Stripe.checkpoint_id)
    )
    return list(rows)


def held_copies(session: Session, checkpoint_id: int, tier: str, holder: str) -> list[RecordedCopy]:
    """The checkpoint's stripes on `tier` that `holder` holds, each at its shard's path with the
    size and crc32c the encoder recorded: what expiring the copy may delete there."""
    rows = session.execute(
        select(Shard.path, Stripe.size, Stripe.crc32c)
        .join(Shard, Shard.id == Stripe.shard_id)
        .where(Stripe.checkpoint_id == checkpoint_id, Stripe.tier == tier, Stripe.node_id == holder)
        .order_by(Shard.ordinal)
    )
    return [RecordedCopy(path, size, crc) for path, size, crc in rows]
