"""One checkpoint's copy on one tier, as the integrity checks an operator or a reader asks for
see it: how many of its replicas are verified, one shard's replica there, and what became of a
replica after it was reported bad."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.models import VERIFIED, Replica, Shard, Stripe, TierCopy
from tierpoint.errors import CopyNotFound


@dataclass(frozen=True)
class CopyRef:
    checkpoint_id: int
    job_id: int
    shard_id: int
    replica_id: int
    node: str | None
    state: str
    recently_read: bool


@dataclass(frozen=True)
class CopyState:
    replica: str | None
    tier_copy: str | None
    # Verified replicas of the same shard on the other tiers: the sources a repair can copy from.
    sources: int


def verified_replicas(session: Session, checkpoint_id: int, tier: str) -> int:
    n = session.scalar(
        select(func.count()).where(
            Replica.checkpoint_id == checkpoint_id,
            Replica.tier == tier,
            Replica.state == VERIFIED,
        )
    )
    return int(n or 0)


def find_copy(
    session: Session,
    job: str,
    step: int,
    tier: str,
    path: str,
    recheck_after: timedelta,
    branch: int | None = None,
) -> CopyRef:
    """The replica of shard `path` of the checkpoint at (job, step) (on `branch` when given:
    `locks.at_step`) on `tier` (the caller checked the tier is configured); `recently_read` when
    it was read back within `recheck_after`. Raises JobNotFound, CheckpointNotFound,
    CopyNotFound."""
    cp = find_checkpoint(session, job, step, branch=branch)
    row = (
        session.execute(
            select(
                Shard.id,
                Replica.id,
                Replica.node_id,
                Replica.state,
                Replica.scrubbed_at > func.now() - recheck_after,
            )
            .outerjoin(Replica, and_(Replica.shard_id == Shard.id, Replica.tier == tier))
            .where(Shard.checkpoint_id == cp.id, Shard.path == path)
        )
    ).one_or_none()
    if row is None:
        raise CopyNotFound(f"{job}/{step} has no shard {path!r}")
    if row[1] is None:
        raise CopyNotFound(f"{job}/{step}: {path!r} has no copy on tier {tier!r}")
    return CopyRef(cp.id, cp.job_id, row[0], row[1], row[2], row[3], bool(row[4]))


def copy_state(session: Session, ref: CopyRef, tier: str) -> CopyState:
    state = session.scalar(select(Replica.state).where(Replica.id == ref.replica_id))
    tier_copy = session.scalar(
        select(TierCopy.state).where(
            TierCopy.checkpoint_id == ref.checkpoint_id, TierCopy.tier == tier
        )
    )
    sources = session.scalar(
        select(func.count()).where(
            Replica.shard_id == ref.shard_id,
            Replica.tier != tier,
            Replica.state == VERIFIED,
        )
    )
    return CopyState(state, tier_copy, int(sources or 0))


@dataclass(frozen=True)
class StripeCopyRef:
    """One stripe of a shard's set on a coded tier, as a reader's report names it."""

    checkpoint_id: int
    job_id: int
    stripe_id: int
    holder: str
    state: str
    recently_read: bool


def find_stripe(
    session: Session,
    job: str,
    step: int,
    tier: str,
    path: str,
    index: int,
    recheck_after: timedelta,
    branch: int | None = None,
) -> StripeCopyRef:
    """Stripe `index` of shard `path`'s set on coded tier `tier`, as `find_copy` finds a
    replica; `recently_read` when its holder's scrub read it back good within `recheck_after`.
    Raises JobNotFound, CheckpointNotFound, CopyNotFound."""
    cp = find_checkpoint(session, job, step, branch=branch)
    row = session.execute(
        select(
            Shard.id,
            Stripe.id,
            Stripe.node_id,
            Stripe.state,
            Stripe.scrubbed_at > func.now() - recheck_after,
        )
        .outerjoin(
            Stripe,
            and_(Stripe.shard_id == Shard.id, Stripe.tier == tier, Stripe.stripe_index == index),
        )
        .where(Shard.checkpoint_id == cp.id, Shard.path == path)
    ).one_or_none()
    if row is None:
        raise CopyNotFound(f"{job}/{step} has no shard {path!r}")
    if row[1] is None:
        raise CopyNotFound(f"{job}/{step}: {path!r} has no stripe {index} on tier {tier!r}")
    return StripeCopyRef(cp.id, cp.job_id, row[1], row[2], row[3], bool(row[4]))


def stripe_state(session: Session, ref: StripeCopyRef, tier: str) -> CopyState:
    """The stripe's state and its coded copy's; `sources` is 0: a stripe is made again by a
    rebuild, never copied from another tier."""
    state = session.scalar(select(Stripe.state).where(Stripe.id == ref.stripe_id))
    tier_copy = session.scalar(
        select(TierCopy.state).where(
            TierCopy.checkpoint_id == ref.checkpoint_id, TierCopy.tier == tier
        )
    )
    return CopyState(state, tier_copy, 0)
