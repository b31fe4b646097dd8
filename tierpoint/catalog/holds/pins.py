"""Pins: an operator's promise that no copy of a checkpoint expires while it is pinned.

A pin locks the checkpoint row before it changes anything, as the retention executor does before
it begins an expiry (and as a lease does, `leases.py`): a pin either commits before the executor's
re-check (which then sees it and keeps every copy) or after the flip to `expiring`. After the
flip that copy is being deleted and nothing brings it back: the pin is refused then (409
`copy_expiring`, naming the tiers), since a pin that answered yes would be a promise already
broken."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.locks import ACTION_LOCK
from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.errors import CopyExpiring
from tierpoint.states import TierState


@dataclass
class PinView:
    job: str
    step: int
    pinned: bool
    changed: bool


def expiring_tiers(session: Session, checkpoint_id: int) -> list[str]:
    """Tiers whose copy retention has begun deleting (tier copy `expiring`). Read after the row
    lock: the executor flips tier copies only while it holds that row, so this sees every
    committed flip."""
    rows = session.scalars(
        select(TierCopy.tier)
        .where(
            TierCopy.checkpoint_id == checkpoint_id,
            TierCopy.state == TierState.EXPIRING.value,
        )
        .order_by(TierCopy.tier)
    )
    return list(rows.all())


def set_pinned(
    session: Session, job: str, step: int, pinned: bool, actor: str, branch: int | None = None
) -> PinView:
    """Pin or unpin the checkpoint at `step` (on `branch` when given: `locks.at_step`); doing it
    again changes nothing and records nothing. A pin is refused while a copy is being expired:
    it could not keep that copy, and a pin that answered yes would be a promise already
    broken."""
    checkpoint_id, job_id, was = find_checkpoint(
        session, job, step, lock=ACTION_LOCK, branch=branch
    )
    if was == pinned:
        return PinView(job, step, pinned, False)
    # guard: pin-refused-during-expiry
    if pinned and (expiring := expiring_tiers(session, checkpoint_id)):
        raise CopyExpiring(
            f"step {step} of job {job!r} is being expired on {', '.join(expiring)}: a pin cannot "
            "keep those copies; pin again once their expiry has finished to keep the others",
            extra={"tiers": expiring},
        )
    checkpoint = session.get_one(Checkpoint, checkpoint_id)
    checkpoint.pinned = pinned
    detail: dict[str, Any] = {"step": step}
    record(
        session,
        EventKind.PINNED if pinned else EventKind.UNPINNED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        actor=actor,
        detail=detail,
    )
    session.flush()
    return PinView(job, step, pinned, True)
