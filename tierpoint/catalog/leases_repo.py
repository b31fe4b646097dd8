"""Restore leases and pins: the two ways to keep a checkpoint from expiring.

Both lock the checkpoint row (SELECT ... FOR NO KEY UPDATE, `find_checkpoint`) in the caller's
transaction before they change anything, as the retention executor does (FOR UPDATE, which this
waits for) before it flips a marker to `expiring`: a lease or pin either commits before the
executor's re-check (which then sees it and keeps every copy) or after the flip. After the flip the
copy is being deleted and nothing brings it back: a pin is then refused (409 `copy_expiring`,
naming the tiers), since it promises that no copy expires; a lease holds only the copies that are
restorable, so it is refused only when no tier is. Lease times are the database's clock, the same
clock the snapshot and the executor compare them with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, insert, select
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint_lookup import find_checkpoint
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.models import Checkpoint, CheckpointTier, Job, RestoreLease
from tierpoint.errors import (
    CopyExpiring,
    LeaseEnded,
    LeaseNotFound,
    NotLeasable,
)
from tierpoint.states import TierState

MAX_LEASE_SECONDS = 86400


@dataclass
class LeaseView:
    id: int
    job: str
    step: int
    holder: str | None
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None
    active: bool


@dataclass
class PinView:
    job: str
    step: int
    pinned: bool
    changed: bool


def lock_checkpoint(session: Session, job: str, step: int) -> tuple[int, int, bool]:
    """(checkpoint id, job id, pinned) with the checkpoint row locked until commit."""
    key = find_checkpoint(session, job, step, lock=True)
    return key.id, key.job_id, key.pinned


def restorable_tiers(session: Session, checkpoint_id: int) -> list[str]:
    """Tiers the checkpoint is restorable from (marker restorable, neither it nor the checkpoint
    quarantined). Read after the row lock, so it sees every committed marker flip."""
    quarantined = exists().where(
        Checkpoint.id == checkpoint_id, Checkpoint.quarantine_reason.is_not(None)
    )
    rows = session.scalars(
        select(CheckpointTier.tier)
        .where(
            CheckpointTier.checkpoint_id == checkpoint_id,
            CheckpointTier.state == TierState.RESTORABLE.value,
            CheckpointTier.quarantine_reason.is_(None),
            ~quarantined,
        )
        .order_by(CheckpointTier.tier)
    )
    return list(rows.all())


def expiring_tiers(session: Session, checkpoint_id: int) -> list[str]:
    """Tiers whose copy retention has begun deleting (marker `expiring`). Read after the row lock:
    the executor flips markers only while it holds that row, so this sees every committed flip."""
    rows = session.scalars(
        select(CheckpointTier.tier)
        .where(
            CheckpointTier.checkpoint_id == checkpoint_id,
            CheckpointTier.state == TierState.EXPIRING.value,
        )
        .order_by(CheckpointTier.tier)
    )
    return list(rows.all())


def insert_lease(
    session: Session,
    checkpoint_id: int,
    job_id: int,
    job: str,
    step: int,
    ttl_seconds: int,
    holder: str | None,
    actor: str,
) -> LeaseView:
    """A new lease on a checkpoint whose row the caller has locked and found restorable."""
    row = (
        session.execute(
            insert(RestoreLease)
            .values(
                checkpoint_id=checkpoint_id,
                holder=holder,
                expires_at=func.now() + timedelta(seconds=ttl_seconds),
            )
            .returning(RestoreLease.id, RestoreLease.created_at, RestoreLease.expires_at)
        )
    ).one()
    record(
        session,
        EventKind.LEASED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        actor=actor,
        detail={
            "action": "created",
            "lease_id": row.id,
            "holder": holder,
            "ttl_seconds": ttl_seconds,
            "expires_at": row.expires_at.isoformat(),
        },
    )
    return LeaseView(row.id, job, step, holder, row.created_at, row.expires_at, None, True)


def create_lease(
    session: Session, job: str, step: int, ttl_seconds: int, holder: str | None, actor: str
) -> LeaseView:
    checkpoint_id, job_id, _ = lock_checkpoint(session, job, step)
    if not restorable_tiers(session, checkpoint_id):
        raise NotLeasable(
            f"step {step} of job {job!r} is not restorable from any tier (not yet copied, "
            "quarantined, or expired): there is nothing a lease could hold"
        )
    return insert_lease(session, checkpoint_id, job_id, job, step, ttl_seconds, holder, actor)


def _lease_locked(
    session: Session, job: str, step: int, lease_id: int
) -> tuple[RestoreLease, int, bool]:
    """The lease (row locked), its job id, and whether the database clock has passed its end."""
    row = (
        session.execute(
            select(RestoreLease, Checkpoint.job_id, RestoreLease.expires_at <= func.now())
            .join(Checkpoint, Checkpoint.id == RestoreLease.checkpoint_id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(RestoreLease.id == lease_id, Job.name == job, Checkpoint.step == step)
            .with_for_update(of=RestoreLease)
        )
    ).one_or_none()
    if row is None:
        raise LeaseNotFound(f"no lease {lease_id} on step {step} of job {job!r}")
    return row[0], int(row[1]), bool(row[2])


def _view(lease: RestoreLease, job: str, step: int, lapsed: bool) -> LeaseView:
    return LeaseView(
        lease.id,
        job,
        step,
        lease.holder,
        lease.created_at,
        lease.expires_at,
        lease.released_at,
        lease.released_at is None and not lapsed,
    )


def renew_lease(
    session: Session, job: str, step: int, lease_id: int, ttl_seconds: int, actor: str
) -> LeaseView:
    """Extend a live lease to now + ttl. A released or lapsed lease is not revived (retention may
    have started expiring the checkpoint once it lapsed): take a new one."""
    lease, job_id, lapsed = _lease_locked(session, job, step, lease_id)
    if lease.released_at is not None or lapsed:
        what = "released" if lease.released_at is not None else "expired"
        raise LeaseEnded(
            f"lease {lease_id} has {what}; take a new lease (POST .../leases)",
            extra={"lease_id": lease_id},
        )
    expires_at = session.scalar(select(func.now() + timedelta(seconds=ttl_seconds)))
    assert expires_at is not None
    lease.expires_at = expires_at
    record(
        session,
        EventKind.LEASED,
        checkpoint_id=lease.checkpoint_id,
        job_id=job_id,
        actor=actor,
        detail={
            "action": "renewed",
            "lease_id": lease_id,
            "ttl_seconds": ttl_seconds,
            "expires_at": expires_at.isoformat(),
        },
    )
    session.flush()
    return _view(lease, job, step, False)


def release_lease(
    session: Session, job: str, step: int, lease_id: int, actor: str
) -> tuple[LeaseView, bool]:
    """Release the lease; releasing it again changes nothing. Returns (lease, released now)."""
    lease, job_id, lapsed = _lease_locked(session, job, step, lease_id)
    if lease.released_at is not None:
        return _view(lease, job, step, lapsed), False
    now = session.scalar(select(func.now()))
    lease.released_at = now
    record(
        session,
        EventKind.LEASED,
        checkpoint_id=lease.checkpoint_id,
        job_id=job_id,
        actor=actor,
        detail={"action": "released", "lease_id": lease_id},
    )
    session.flush()
    return _view(lease, job, step, lapsed), True


def list_leases(
    session: Session, job: str, step: int, *, include_ended: bool = False
) -> list[LeaseView]:
    checkpoint = find_checkpoint(session, job, step)
    lapsed = RestoreLease.expires_at <= func.now()
    q = select(RestoreLease, lapsed).where(RestoreLease.checkpoint_id == checkpoint.id)
    if not include_ended:
        q = q.where(RestoreLease.released_at.is_(None), ~lapsed)
    rows = session.execute(q.order_by(RestoreLease.id)).all()
    return [_view(r[0], job, step, bool(r[1])) for r in rows]


def set_pinned(session: Session, job: str, step: int, pinned: bool, actor: str) -> PinView:
    """Pin or unpin; doing it again changes nothing and records nothing. A pin is refused while
    a copy is being expired: it could not keep that copy, and a pin that answered yes would be a
    promise already broken."""
    checkpoint_id, job_id, was = lock_checkpoint(session, job, step)
    if was == pinned:
        return PinView(job, step, pinned, False)
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
