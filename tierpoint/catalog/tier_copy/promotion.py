"""Promotion of a checkpoint's copy on one tier: its marker becomes `restorable` only when every
shard has a verified replica there (on a node that is not lost), else `failed` with a reason that
names a few bad shards, and the later tiers, which would copy from it, fail with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.holds.rebuild import release
from tierpoint.catalog.models import VERIFIED, Replica, Shard, TierCopy
from tierpoint.catalog.replica.placement import not_on_lost_node
from tierpoint.states import ReplicaState, TierState

# How many bad shards a failure reason names.
# Who the events of a lifecycle (its seal, copies and promotions) name.
ACTOR = "lifecycle"
# How many bad shards a failure reason names.
REASON_EXAMPLES = 3


@dataclass(frozen=True)
class PromoteOutcome:
    state: str
    reason: str | None
    changed: bool
    # The tier's first promotion (not a repair's or a retry's after it was restorable once):
    # promotion lag is registration -> first promotion.
    first: bool = False


@dataclass(frozen=True)
class _Marker:
    state: str
    reason: str | None
    job_id: int
    restorable_at: object
    rebuilding: bool


def promote(
    session: Session,
    checkpoint_id: int,
    tier: str,
    later_tiers: Sequence[str],
    stage_error: str | None,
) -> PromoteOutcome:
    """Flip the tier's marker in the caller's transaction: `restorable` only if every shard has a
    verified replica on the tier, else `failed` with a reason, and later tiers `failed` too."""
    marker = _lock_marker(session, checkpoint_id, tier)
    if marker.rebuilding:
        # A rebuild of this copy (re-replication, repair) ends here, made or given up: the
        # copies it read from are retention's again.
        # guard: promotion-releases-the-hold
        release(session, checkpoint_id, tier)
    if marker.state not in (TierState.PENDING.value, TierState.FAILED.value):
        # restorable already (a rerun), or retention has taken over.
        return PromoteOutcome(marker.state, marker.reason, changed=False)
    total, verified = _shard_counts(session, checkpoint_id, tier)
    # guard: promote-count
    if verified == total and stage_error is None:
        _mark_restorable(session, checkpoint_id, marker.job_id, tier, total)
        return PromoteOutcome(
            TierState.RESTORABLE.value, None, changed=True, first=marker.restorable_at is None
        )

    bad = total - verified
    parts = []
    if bad:
        examples = ", ".join(_bad_examples(session, checkpoint_id, tier))
        parts.append(f"{bad} of {total} shards have no verified replica on {tier}: {examples}")
    if stage_error:
        parts.append(stage_error)
    why = "; ".join(parts)
    job_id = marker.job_id
    _fail(
        session, checkpoint_id, job_id, tier, why, from_states=(TierState.PENDING, TierState.FAILED)
    )
    source_failed = f"source tier {tier} failed"
    for later in later_tiers:
        _fail(
            session, checkpoint_id, job_id, later, source_failed, from_states=(TierState.PENDING,)
        )
    return PromoteOutcome(TierState.FAILED.value, why, changed=True)


def _lock_marker(session: Session, checkpoint_id: int, tier: str) -> _Marker:
    row = session.execute(
        select(
            TierCopy.state,
            TierCopy.reason,
            TierCopy.job_id,
            TierCopy.restorable_at,
            TierCopy.rebuild_from.is_not(None),
        )
        .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
        .with_for_update()
    ).one_or_none()
    if row is None:
        raise LookupError(f"checkpoint {checkpoint_id} has no marker for tier {tier!r}")
    return _Marker(*row)


def _shard_counts(session: Session, checkpoint_id: int, tier: str) -> tuple[int, int]:
    """(shards of the checkpoint, of them verified on the tier on a node that is not lost)."""
    total = session.scalar(
        select(func.count()).select_from(Shard).where(Shard.checkpoint_id == checkpoint_id)
    )
    verified = session.scalar(
        select(func.count())
        .select_from(Replica)
        .where(
            Replica.checkpoint_id == checkpoint_id,
            # guard: promote-verified-filter
            Replica.tier == tier,
            # guard: promote-lost-node
            Replica.state == ReplicaState.VERIFIED.value,
            not_on_lost_node(),
        )
    )
    assert total is not None and verified is not None
    return total, verified


def _mark_restorable(
    session: Session, checkpoint_id: int, job_id: int, tier: str, shards: int
) -> None:
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
        .values(
            state=TierState.RESTORABLE.value,
            reason=None,
            # The first promotion's time: a repair's promotion later does not move it, so
            # the lag (registration -> restorable) is never a repair's.
            restorable_at=func.coalesce(TierCopy.restorable_at, func.now()),
            updated_at=func.now(),
        )
    )
    record(
        session,
        EventKind.PROMOTED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        tier=tier,
        actor=ACTOR,
        detail={"shards": shards},
    )


def _bad_examples(session: Session, checkpoint_id: int, tier: str) -> list[str]:
    rows = session.execute(
        select(Shard.path, Replica.state, Replica.error)
        .outerjoin(Replica, and_(Replica.shard_id == Shard.id, Replica.tier == tier))
        .where(
            Shard.checkpoint_id == checkpoint_id,
            func.coalesce(Replica.state, "") != VERIFIED,
        )
        .order_by(Shard.ordinal)
        .limit(REASON_EXAMPLES)
    )
    out = []
    for path, state, error in rows:
        what = error or state or "no replica"
        out.append(f"{path} ({what})")
    return out


def _fail(
    session: Session,
    checkpoint_id: int,
    job_id: int,
    tier: str,
    reason: str,
    from_states: Sequence[TierState],
) -> None:
    result = session.execute(
        update(TierCopy)
        .where(
            TierCopy.checkpoint_id == checkpoint_id,
            TierCopy.tier == tier,
            TierCopy.state.in_([s.value for s in from_states]),
        )
        .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
    )
    if getattr(result, "rowcount", 0):
        record(
            session,
            EventKind.FAILED,
            checkpoint_id=checkpoint_id,
            job_id=job_id,
            tier=tier,
            actor=ACTOR,
            detail={"reason": reason},
        )
