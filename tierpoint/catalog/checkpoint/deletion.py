"""An admin's deletion of checkpoints: the catalog side. Deleting never removes a byte here: every
tier copy becomes `expiring` in the caller's transaction (committed before any byte goes,
invariant 3), and retention's own expiry (`activities/retention.py`: delete the copy, then
`expiring -> expired`) removes the bytes exactly as it removes a copy a policy let go. The
checkpoint row stays, with `deleted_at`, so that its history stays readable and "latest" never
offers it; registering its step again replaces it once every copy is expired.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import no_checkpoint, require_job_id
from tierpoint.catalog.locks import (
    ACTION_LOCK,
    EVERY_TIER_COPY,
    CheckpointsOf,
    Locked,
    lock_in_order,
)
from tierpoint.catalog.models import Checkpoint, RestoreLease, TierCopy
from tierpoint.catalog.replica.machine import Move as ReplicaMove
from tierpoint.catalog.replica.machine import expire
from tierpoint.catalog.tier_copy.machine import Move, move, sources
from tierpoint.errors import CheckpointProtected
from tierpoint.states import TierState

# Tier copies the deletion sends to expiry (a DELETED move's sources): a restorable copy, and the
# bytes a pending or failed copy may have written (its directory is removed the same way).
_TO_EXPIRE = sources(Move.DELETED)


@dataclass(frozen=True)
class DeletedCheckpoint:
    checkpoint_id: int
    step: int
    tiers: list[str]  # the copies sent to expiry
    # what protected it and was overridden by force: "pinned", "leased", "in flight"
    overrode: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Deletion:
    job: str
    deleted: list[DeletedCheckpoint]
    already_deleted: list[int]  # steps deleted before: nothing more to do


def _protections(session: Session, rows: list[tuple[int, int, bool]]) -> dict[int, list[str]]:
    """checkpoint id -> why it may not be deleted without force (pinned, held by a restore lease,
    a copy still in flight: its run would write bytes nobody deletes)."""
    ids = [cid for cid, _, _ in rows]
    leased = set(
        session.scalars(
            select(RestoreLease.checkpoint_id).where(
                RestoreLease.checkpoint_id.in_(ids),
                RestoreLease.released_at.is_(None),
                RestoreLease.expires_at > func.now(),
            )
        )
    )
    pending = set(
        session.scalars(
            select(TierCopy.checkpoint_id).where(
                TierCopy.checkpoint_id.in_(ids),
                TierCopy.state == TierState.PENDING.value,
            )
        )
    )
    out: dict[int, list[str]] = {}
    for cid, _, pinned in rows:
        why = [
            w
            for w, on in (
                ("pinned", pinned),
                ("leased", cid in leased),
                ("in flight", cid in pending),
            )
            if on
        ]
        if why:
            out[cid] = why
    return out


def delete_checkpoints(
    session: Session,
    job: str,
    step: int | None,
    actor: str,
    *,
    force: bool,
    keep_newest: bool = False,
    branch: int | None = None,
) -> Deletion:
    """Send every copy of the job's checkpoint at `step` (on `branch` when given: `locks.at_step`;
    None: all its checkpoints) to expiry and
    mark it deleted, recording one `deleted` event each with `actor`. Raises JobNotFound,
    CheckpointNotFound, CheckpointProtected (pinned, leased or in flight, unless `force`; with
    `keep_newest`, a training job's purge, also the job's newest restorable checkpoint, which
    retention never expires either). Locks the checkpoint rows (as every action locks them,
    `locks.ACTION_LOCK`), then their tier copies, as retention's expiry does; the caller commits."""
    job_id = require_job_id(session, job)
    # The checkpoint rows, then every tier copy of them, as retention's expiry locks them.
    locked = lock_in_order(
        session,
        checkpoints=CheckpointsOf(job_id, step, branch),
        checkpoint_lock=ACTION_LOCK,
        tier_copies=EVERY_TIER_COPY,
    )
    found = sorted(locked.checkpoints.values(), key=lambda c: c.id)
    if step is not None and not found:
        raise no_checkpoint(job, step, branch)
    already = [r.step for r in found if r.deleted_at is not None]
    undeleted = [(r.id, r.step, r.pinned) for r in found if r.deleted_at is None]
    if not undeleted:
        return Deletion(job, [], already)
    ids = [cid for cid, _, _ in undeleted]
    tier_copies = [locked.tier_copies[k] for k in sorted(locked.tier_copies) if k[0] in set(ids)]
    protected = _protections(session, undeleted)
    newest = _newest_restorable(session, job_id) if keep_newest else None
    # guard: purge-deletes-newest
    if newest is not None and newest in ids:
        protected.setdefault(newest, []).append("the job's newest restorable checkpoint")
    steps = {cid: s for cid, s, _ in undeleted}
    # guard: delete-ignores-protection
    if protected and not force:
        what = "; ".join(f"step {steps[c]} is {' and '.join(w)}" for c, w in protected.items())
        raise CheckpointProtected(
            f"{job}: {what}: delete it with force to delete it anyway",
            extra={"protected": {str(steps[c]): w for c, w in protected.items()}},
        )
    reason = f"deleted by {actor}"
    deleted = []
    for cid in ids:
        tiers = [m.tier for m in tier_copies if m.checkpoint_id == cid and m.state in _TO_EXPIRE]
        _expire_copies(session, locked, cid, tiers, reason)
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.id == cid)
            .values(deleted_at=func.now(), pinned=False)
        )
        overrode = protected.get(cid, [])
        record(
            session,
            EventKind.DELETED,
            checkpoint_id=cid,
            job_id=job_id,
            actor=actor,
            detail={"step": steps[cid], "tiers": tiers, "force": force, "overrode": overrode},
        )
        deleted.append(DeletedCheckpoint(cid, steps[cid], tiers, overrode))
    return Deletion(job, deleted, already)


def _newest_restorable(session: Session, job_id: int) -> int | None:
    """The id of the job's newest checkpoint that a restore could use now: on its timeline, as
    `latest` answers (a superseded checkpoint, even of a higher step, is not it)."""
    return session.scalar(
        select(Checkpoint.id)
        .join(TierCopy, TierCopy.checkpoint_id == Checkpoint.id)
        .where(
            Checkpoint.job_id == job_id,
            # guard: purge-keeps-the-timelines-newest
            Checkpoint.superseded_by.is_(None),
            Checkpoint.deleted_at.is_(None),
            Checkpoint.quarantine_reason.is_(None),
            TierCopy.state == TierState.RESTORABLE.value,
            TierCopy.quarantine_reason.is_(None),
        )
        .order_by(Checkpoint.step.desc())
        .limit(1)
    )


def _expire_copies(
    session: Session, locked: Locked, checkpoint_id: int, tiers: list[str], reason: str
) -> None:
    """The tier copies -> `expiring` and their replicas with them: what retention's begin_expiry
    does once its planner has decided, so its executor finishes these as unfinished expiries."""
    copies = [(checkpoint_id, t) for t in tiers]
    move(session, locked, Move.DELETED, copies, reason=reason)
    expire(session, locked, ReplicaMove.DELETED, copies)
