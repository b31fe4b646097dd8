"""Quarantine: an operator's or a job's verdict that a checkpoint (or one tier's copy of it) must
not be restored from, e.g. it failed to load or the loss went NaN right after loading.

A quarantined checkpoint or copy is skipped by latest restorable (with its reason in `skipped`)
and cannot be leased. An operator's quarantine (operate or admin scope) is also evidence:
retention never expires it. A training job's quarantine only hides: its copies stay under the
job's policy, so a job cannot hold storage past its policy by quarantining its own checkpoints;
nor does a job's report turn an operator's evidence back into a mere hide.

Setting and lifting lock the checkpoint row and then the tier copy, in the order the retention
executor locks them (`tier_copy/expiry.py`), so a quarantine either commits before the executor's
re-check (which then keeps the copy) or after its flip to `expiring`: a tier's copy is then
refused (409 `copy_expiring`); the whole checkpoint is still quarantined, as hiding it from
restores must not wait, and copies already `expiring` are not kept (the answer shows them so).
"""

from __future__ import annotations

from sqlalchemy import func, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import no_checkpoint, require_job_id
from tierpoint.catalog.locks import (
    EVERY_TIER_COPY,
    CheckpointAt,
    Locked,
    LockedTierCopy,
    lock_in_order,
)
from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.errors import CopyExpiring, TierCopyNotFound
from tierpoint.states import TierState

_GONE = frozenset({TierState.EXPIRING.value, TierState.EXPIRED.value})


def _lock(
    session: Session, job: str, step: int, tier: str | None, branch: int | None = None
) -> Locked:
    """The checkpoint row, then its tier copy on `tier` (if given), locked until commit. Raises
    JobNotFound, CheckpointNotFound, or TierCopyNotFound when it has no copy on `tier`."""
    locked = lock_in_order(
        session,
        checkpoints=CheckpointAt(job, step, branch),
        tier_copies=EVERY_TIER_COPY if tier is not None else (),
        tiers=None if tier is None else [tier],
    )
    if not locked.checkpoints:
        require_job_id(session, job)
        raise no_checkpoint(job, step)
    if tier is not None and not locked.tier_copies:
        raise TierCopyNotFound(f"step {step} of job {job!r} has no copy on tier {tier!r}")
    return locked


def set_quarantine(
    session: Session,
    job: str,
    step: int,
    reason: str | None,
    *,
    tier: str | None,
    actor: str,
    evidence: bool = False,
    branch: int | None = None,
) -> bool:
    """Quarantine (a reason) or lift (None) the checkpoint, or only its copy on `tier`; with
    `evidence` (an operator's), retention keeps it too. Doing the same again changes and records
    nothing; a new reason replaces the old one, except that a job's quarantine leaves an
    operator's evidence as it is. Returns whether anything changed."""
    locked = _lock(session, job, step, tier, branch)
    (held_checkpoint,) = locked.checkpoints.values()
    checkpoint_id, job_id = held_checkpoint.id, held_checkpoint.job_id
    target: Checkpoint | LockedTierCopy
    if tier is None:
        target = session.get_one(Checkpoint, checkpoint_id)
    else:
        (target,) = locked.tier_copies.values()
        # guard: quarantine-expiring-copy
        if reason is not None and target.state in _GONE:
            # Its bytes are being (or have been) deleted: a quarantine could not keep them.
            raise CopyExpiring(
                f"the copy of step {step} on tier {tier!r} is {target.state}: retention is "
                "deleting it and nothing can keep it as evidence",
                extra={"state": target.state},
            )
    before = target.quarantine_reason
    held = before is not None and target.quarantine_evidence
    if reason is not None and held and not evidence:
        return False
    keep = reason is not None and evidence
    if before == reason and held == keep:
        return False
    if isinstance(target, LockedTierCopy):
        session.execute(
            update(TierCopy)
            .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
            .values(quarantine_reason=reason, quarantine_evidence=keep, updated_at=func.now())
            .execution_options(synchronize_session=False)
        )
    else:
        target.quarantine_reason = reason
        target.quarantine_evidence = keep
    detail: dict[str, str | int | bool | None] = {"step": step}
    if reason is not None:
        detail["reason"] = reason
        detail["evidence"] = keep
    if before is not None:
        detail["previous_reason"] = before
    record(
        session,
        EventKind.QUARANTINED if reason is not None else EventKind.QUARANTINE_LIFTED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        tier=tier,
        actor=actor,
        detail=detail,
    )
    session.flush()
    return True
