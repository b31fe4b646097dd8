"""An operator's acknowledgement of a failed copy: it leaves the failures view (and the jobs'
failed counts) and stays in the checkpoint's history as an `acknowledged` event with the actor.

The marker keeps its state (`failed`: nothing was copied, retention still protects the other
copies); `acknowledged_at` records the `updated_at` it acknowledged, so any later change of the
marker (a retry, another failure) brings it back to the view without anyone clearing a flag.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.leases_repo import lock_checkpoint
from tierpoint.catalog.models import CheckpointTier
from tierpoint.errors import NothingToAcknowledge
from tierpoint.states import TierState


def unacknowledged() -> ColumnElement[bool]:
    """A marker that is failed and that nobody acknowledged since it last changed: what the
    failures view lists and the jobs view counts as failed."""
    ct = CheckpointTier
    return (ct.state == TierState.FAILED.value) & ct.acknowledged_at.is_distinct_from(ct.updated_at)


def acknowledge(
    session: Session, job: str, step: int, tier: str | None, actor: str
) -> dict[str, str | None]:
    """Acknowledge the checkpoint's open failures (on `tier`, or on every tier); returns them
    (tier -> reason). Raises CheckpointNotFound, NothingToAcknowledge. The caller commits."""
    checkpoint_id, job_id, _ = lock_checkpoint(session, job, step)
    ct = CheckpointTier
    where = [ct.checkpoint_id == checkpoint_id, unacknowledged()]
    if tier is not None:
        where.append(ct.tier == tier)
    rows = (
        session.execute(
            select(ct.tier, ct.reason).where(*where).order_by(ct.tier).with_for_update()
        )
    ).all()
    if not rows:
        on = f" on {tier}" if tier is not None else ""
        raise NothingToAcknowledge(f"{job}/{step} has no unacknowledged failure{on}")
    session.execute(update(ct).where(*where).values(acknowledged_at=ct.updated_at))
    for r in rows:
        record(
            session,
            EventKind.ACKNOWLEDGED,
            checkpoint_id=checkpoint_id,
            job_id=job_id,
            tier=r.tier,
            actor=actor,
            detail={"reason": r.reason},
        )
    return {r.tier: r.reason for r in rows}
