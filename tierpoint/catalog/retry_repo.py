"""The catalog side of an operator's retry: the failed tier copies of a checkpoint, locked, and
their reset to `pending` with the retry recorded. Verified replicas are never touched: the new
lifecycle run skips them."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.leases_repo import lock_checkpoint
from tierpoint.catalog.models import CheckpointTier, Event
from tierpoint.states import TierState

RETRY = "retry"


@dataclass(frozen=True)
class RetryTarget:
    checkpoint_id: int
    job_id: int
    failed: dict[str, str | None]  # tier -> reason
    attempt: int  # this retry's number: 1 for the first
    # every marker of the checkpoint: tier -> (state, reason)
    markers: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def lock_failed(session: Session, job: str, step: int) -> RetryTarget:
    """The checkpoint's markers with the checkpoint row and those markers locked until commit,
    so that no promotion (nor expiry) can flip them between the retry's start and its reset
    (raises CheckpointNotFound)."""
    checkpoint_id, job_id, _ = lock_checkpoint(session, job, step)
    rows = session.execute(
        select(CheckpointTier.tier, CheckpointTier.state, CheckpointTier.reason)
        .where(CheckpointTier.checkpoint_id == checkpoint_id)
        .order_by(CheckpointTier.tier)
        .with_for_update()
    )
    markers = {r.tier: (r.state, r.reason) for r in rows}
    failed = {t: reason for t, (st, reason) in markers.items() if st == TierState.FAILED.value}
    done = session.scalar(
        select(func.count()).where(
            Event.checkpoint_id == checkpoint_id,
            Event.kind == EventKind.OPERATOR_ACTION.value,
            Event.detail["action"].astext == RETRY,
        )
    )
    return RetryTarget(checkpoint_id, job_id, failed, int(done or 0) + 1, markers)


def reset_failed(session: Session, target: RetryTarget, actor: str, workflow_id: str) -> None:
    """Failed markers back to `pending` (in flight again), and the retry as an event."""
    session.execute(
        update(CheckpointTier)
        .where(
            CheckpointTier.checkpoint_id == target.checkpoint_id,
            CheckpointTier.tier.in_(list(target.failed)),
            CheckpointTier.state == TierState.FAILED.value,
        )
        .values(state=TierState.PENDING.value, reason=None, updated_at=func.now())
    )
    record(
        session,
        EventKind.OPERATOR_ACTION,
        checkpoint_id=target.checkpoint_id,
        job_id=target.job_id,
        actor=actor,
        detail={
            "action": RETRY,
            "attempt": target.attempt,
            "workflow_id": workflow_id,
            "tiers": sorted(target.failed),
            "reasons": target.failed,
        },
    )
