"""Restore leases: a restore's hold on a checkpoint, which keeps its copies from expiring while
the lease is active (not released, not past its end). Pins are the operator's hold (`pins.py`).

A lease locks the checkpoint row FOR KEY SHARE in the caller's transaction before it reads
anything, and the retention executor locks it FOR UPDATE before it re-checks and flips a tier copy
to `expiring`: the two conflict, so a lease either commits before the executor's re-check (which
then sees it and keeps every copy) or waits for the flip and sees it; it holds only the copies
that are restorable, so it is refused only when no tier is. KEY SHARE does not conflict with
itself: leases on one checkpoint (every node of a job restarting at once) never wait for each
other, and a lease costs the same however many are held. Lease times are the database's clock,
the same clock the snapshot and the executor compare them with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import exists, func, insert, select
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.locks import LEASE_LOCK
from tierpoint.catalog.models import Checkpoint, Job, RestoreLease, TierCopy
from tierpoint.errors import (
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
    owner: str | None
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None
    active: bool


def restorable_tiers(session: Session, checkpoint_id: int) -> list[str]:
    """Tiers the checkpoint is restorable from (tier copy restorable, neither it nor the checkpoint
    quarantined). Read after the row lock, so it sees every committed tier copy flip."""
    quarantined = exists().where(
        Checkpoint.id == checkpoint_id, Checkpoint.quarantine_reason.is_not(None)
    )
    rows = session.scalars(
        select(TierCopy.tier)
        .where(
            TierCopy.checkpoint_id == checkpoint_id,
            TierCopy.state == TierState.RESTORABLE.value,
            TierCopy.quarantine_reason.is_(None),
            ~quarantined,
        )
        .order_by(TierCopy.tier)
    )
    return list(rows.all())


def insert_lease(
    session: Session,
    checkpoint_id: int,
    job_id: int,
    job: str,
    step: int,
    ttl_seconds: int,
    owner: str | None,
    actor: str,
) -> LeaseView:
    """A new lease on a checkpoint whose row the caller has locked and found restorable."""
    row = (
        session.execute(
            insert(RestoreLease)
            .values(
                checkpoint_id=checkpoint_id,
                owner=owner,
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
            "holder": owner,
            "ttl_seconds": ttl_seconds,
            "expires_at": row.expires_at.isoformat(),
        },
    )
    return LeaseView(row.id, job, step, owner, row.created_at, row.expires_at, None, True)


def create_lease(
    session: Session,
    job: str,
    step: int,
    ttl_seconds: int,
    owner: str | None,
    actor: str,
    *,
    branch: int | None = None,
) -> LeaseView:
    """A lease on the checkpoint at `step` (`locks.at_step`: on `branch` when given)."""
    # guard: lease-waits-for-expiry
    checkpoint_id, job_id, _ = find_checkpoint(session, job, step, branch=branch, lock=LEASE_LOCK)
    if not restorable_tiers(session, checkpoint_id):
        raise NotLeasable(
            f"step {step} of job {job!r} is not restorable from any tier (not yet copied, "
            "quarantined, or expired): there is nothing a lease could hold"
        )
    return insert_lease(session, checkpoint_id, job_id, job, step, ttl_seconds, owner, actor)


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
        lease.owner,
        lease.created_at,
        lease.expires_at,
        lease.released_at,
        lease.released_at is None and not lapsed,
    )


def renew_lease(
    session: Session, job: str, step: int, lease_id: int, ttl_seconds: int, actor: str
) -> LeaseView:
    """Extend an active lease to now + ttl. A released or lapsed lease is not revived (retention may
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
    session: Session,
    job: str,
    step: int,
    *,
    include_ended: bool = False,
    branch: int | None = None,
) -> list[LeaseView]:
    checkpoint = find_checkpoint(session, job, step, branch=branch)
    lapsed = RestoreLease.expires_at <= func.now()
    q = select(RestoreLease, lapsed).where(RestoreLease.checkpoint_id == checkpoint.id)
    if not include_ended:
        q = q.where(RestoreLease.released_at.is_(None), ~lapsed)
    rows = session.execute(q.order_by(RestoreLease.id)).all()
    return [_view(r[0], job, step, bool(r[1])) for r in rows]
