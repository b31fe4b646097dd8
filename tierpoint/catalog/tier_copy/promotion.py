"""Promotion of a checkpoint's copy on one tier: the tier copy becomes `restorable` only when
every shard has a verified replica there (on a node that is not lost), else `failed` with a reason
that names a few bad shards, and the later tiers, which would copy from it, fail with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.holds.rebuild import release
from tierpoint.catalog.locks import Locked, lock_in_order
from tierpoint.catalog.models import VERIFIED, Replica, Shard, TierCopy
from tierpoint.catalog.replica.placement import not_on_lost_node
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.states import ReplicaState, TierState

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


def promote(
    session: Session,
    checkpoint_id: int,
    tier: str,
    later_tiers: Sequence[str],
    stage_error: str | None,
    code: Code | None = None,
) -> PromoteOutcome:
    """Move the tier copy in the caller's transaction: to `restorable` only if every shard has a
    verified replica on the tier (on a coded tier, `code`: all k+m stripes verified, the stripe
    coverage's rule), else to `failed` with a reason, and the later tiers' with it.
    The later tiers' tier copies are locked with this one, in the catalog's order, as they may
    fail with it. Raises LookupError when the checkpoint has no tier copy on `tier`."""
    locked = lock_in_order(session, tier_copies=[(checkpoint_id, t) for t in (tier, *later_tiers)])
    tier_copy = locked.tier_copies.get((checkpoint_id, tier))
    if tier_copy is None:
        raise LookupError(f"checkpoint {checkpoint_id} has no tier copy on tier {tier!r}")
    if tier_copy.rebuilding:
        # A rebuild of this copy (re-replication, repair) ends here, made or given up: the
        # copies it read from are retention's again.
        # guard: promotion-releases-the-hold
        release(session, checkpoint_id, tier)
    if tier_copy.state not in (TierState.PENDING.value, TierState.FAILED.value):
        # restorable already (a rerun), or retention has taken over.
        return PromoteOutcome(tier_copy.state, tier_copy.reason, changed=False)
    if code is not None:
        return _promote_coded(session, locked, checkpoint_id, tier, later_tiers, stage_error, code)
    total, verified = _shard_counts(session, checkpoint_id, tier)
    # guard: promote-count
    if verified == total and stage_error is None:
        _mark_restorable(session, locked, checkpoint_id, tier_copy.job_id, tier, total)
        return PromoteOutcome(
            TierState.RESTORABLE.value, None, changed=True, first=tier_copy.restorable_at is None
        )

    bad = total - verified
    parts = []
    if bad:
        examples = ", ".join(_bad_examples(session, checkpoint_id, tier))
        parts.append(f"{bad} of {total} shards have no verified replica on {tier}: {examples}")
    return _fail_with(session, locked, checkpoint_id, tier, later_tiers, parts, stage_error)


def _promote_coded(
    session: Session,
    locked: Locked,
    checkpoint_id: int,
    tier: str,
    later_tiers: Sequence[str],
    stage_error: str | None,
    code: Code,
) -> PromoteOutcome:
    """A coded copy is promoted only with every shard's stripe set whole: verified on holders
    not lost, all k+m of them (after that it stays restorable while every set keeps k)."""
    tier_copy = locked.tier_copies[(checkpoint_id, tier)]
    counts = verified_stripes(session, checkpoint_id, tier)
    got = coverage(code, counts)
    # guard: promote-coded-copy-whole
    if got.promotable and stage_error is None:
        _mark_restorable(session, locked, checkpoint_id, tier_copy.job_id, tier, len(counts))
        return PromoteOutcome(
            TierState.RESTORABLE.value, None, changed=True, first=tier_copy.restorable_at is None
        )
    parts = []
    if got.not_whole:
        shown = ", ".join(f"shard {s}: {counts[s]}" for s in got.not_whole[:REASON_EXAMPLES])
        parts.append(
            f"{len(got.not_whole)} of {len(counts)} shards have fewer than {code.width} "
            f"verified stripes on {tier} ({code}): {shown}"
        )
    return _fail_with(session, locked, checkpoint_id, tier, later_tiers, parts, stage_error)


def _fail_with(
    session: Session,
    locked: Locked,
    checkpoint_id: int,
    tier: str,
    later_tiers: Sequence[str],
    parts: list[str],
    stage_error: str | None,
) -> PromoteOutcome:
    if stage_error:
        parts.append(stage_error)
    why = "; ".join(parts)
    job_id = locked.tier_copies[(checkpoint_id, tier)].job_id
    _fail(session, locked, Move.PROMOTION_FAILED, checkpoint_id, job_id, tier, why)
    source_failed = f"source tier {tier} failed"
    for later in later_tiers:
        _fail(session, locked, Move.SOURCE_FAILED, checkpoint_id, job_id, later, source_failed)
    return PromoteOutcome(TierState.FAILED.value, why, changed=True)


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
    session: Session, locked: Locked, checkpoint_id: int, job_id: int, tier: str, shards: int
) -> None:
    move(
        session,
        locked,
        Move.PROMOTED,
        [(checkpoint_id, tier)],
        reason=None,
        # The first promotion's time: a repair's promotion later does not move it, so the lag
        # (registration -> restorable) is never a repair's.
        restorable_at=func.coalesce(TierCopy.restorable_at, func.now()),
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
    locked: Locked,
    how: Move,
    checkpoint_id: int,
    job_id: int,
    tier: str,
    reason: str,
) -> None:
    if move(session, locked, how, [(checkpoint_id, tier)], reason=reason):
        record(
            session,
            EventKind.FAILED,
            checkpoint_id=checkpoint_id,
            job_id=job_id,
            tier=tier,
            actor=ACTOR,
            detail={"reason": reason},
        )
