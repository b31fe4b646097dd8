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
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.locks import LEASE_LOCK
from tierpoint.catalog.models import Checkpoint, Event, Job, RestoreLease, TierCopy
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


def _restorable(checkpoint_id: Any) -> ColumnElement[bool]:
    """The checkpoint is restorable from some tier: `restorable_tiers` as a condition."""
    quarantined = exists().where(
        Checkpoint.id == checkpoint_id, Checkpoint.quarantine_reason.is_not(None)
    )
    copy = exists().where(
        TierCopy.checkpoint_id == checkpoint_id,
        TierCopy.state == TierState.RESTORABLE.value,
        TierCopy.quarantine_reason.is_(None),
    )
    return copy & ~quarantined


@cache
def _lease_statement(checked: bool) -> Any:
    """One statement for the lease and its event (when `checked`, only if the checkpoint is
    restorable), built once: a storm's leases each paid more API CPU for building and sending
    three statements than for the rest of the request. Its snapshot is taken after the row lock
    of the statement before it, so the check sees every committed flip (module docstring)."""
    checkpoint_id = bindparam("checkpoint_id", type_=BigInteger)
    owner = bindparam("owner", type_=Text)
    ttl = bindparam("ttl_seconds", type_=Integer)
    row = select(checkpoint_id, owner, func.now() + func.make_interval(0, 0, 0, 0, 0, 0, ttl))
    if checked:
        # guard: lease-only-if-restorable
        row = row.where(_restorable(checkpoint_id))
    table = RestoreLease.__table__
    lease = (
        insert(RestoreLease)
        .from_select([table.c.checkpoint_id, table.c.holder, table.c.expires_at], row)
        .returning(RestoreLease.id, RestoreLease.created_at, RestoreLease.expires_at)
        .cte("lease")
    )
    detail = func.jsonb_build_object(
        "action", "created", "lease_id", lease.c.id, "holder", owner,
        "ttl_seconds", ttl, "expires_at", func.to_jsonb(lease.c.expires_at),
    )  # fmt: skip
    event = insert(Event).from_select(
        ["kind", "checkpoint_id", "job_id", "actor", "detail"],
        select(
            literal(EventKind.LEASED.value),
            checkpoint_id,
            bindparam("job_id", type_=BigInteger),
            bindparam("actor", type_=String),
            detail,
        ).select_from(lease),
    )
    return select(lease.c.id, lease.c.created_at, lease.c.expires_at).add_cte(event.cte("event"))


def _insert(
    session: Session,
    checked: bool,
    key: tuple[int, int],
    job: str,
    step: int,
    ttl_seconds: int,
    owner: str | None,
    actor: str,
) -> LeaseView | None:
    checkpoint_id, job_id = key
    params = {
        "checkpoint_id": checkpoint_id,
        "job_id": job_id,
        "owner": owner,
        "ttl_seconds": ttl_seconds,
        "actor": actor,
    }
    row = session.execute(_lease_statement(checked), params).one_or_none()
    if row is None:
        return None
    return LeaseView(row.id, job, step, owner, row.created_at, row.expires_at, None, True)


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
    view = _insert(session, False, (checkpoint_id, job_id), job, step, ttl_seconds, owner, actor)
    assert view is not None  # inserted unconditionally
    return view


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
    """A lease on the checkpoint at `step` (`locks.at_step`: on `branch` when given): two
    statements, the row lock and then the lease with its event if some tier is restorable."""
    # guard: lease-waits-for-expiry
    checkpoint_id, job_id, _ = find_checkpoint(session, job, step, branch=branch, lock=LEASE_LOCK)
    key = (checkpoint_id, job_id)
    view = _insert(session, True, key, job, step, ttl_seconds, owner, actor)
    if view is None:
        raise NotLeasable(
            f"step {step} of job {job!r} is not restorable from any tier (not yet copied, "
            "quarantined, or expired): there is nothing a lease could hold"
        )
    return view


def _lease_locked(
    session: Session, job: str, step: int, lease_id: int
) -> tuple[RestoreLease, int, bool, datetime]:
    """The lease (row locked), its job id, whether the database clock has passed its end, and
    that clock (the transaction's `now()`, read in the same round trip)."""
    row = (
        session.execute(
            select(
                RestoreLease,
                Checkpoint.job_id,
                RestoreLease.expires_at <= func.now(),
                func.now(),
            )
            .join(Checkpoint, Checkpoint.id == RestoreLease.checkpoint_id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(RestoreLease.id == lease_id, Job.name == job, Checkpoint.step == step)
            .with_for_update(of=RestoreLease)
        )
    ).one_or_none()
    if row is None:
        raise LeaseNotFound(f"no lease {lease_id} on step {step} of job {job!r}")
    return row[0], int(row[1]), bool(row[2]), row[3]


@cache
def _release_statement() -> Any:
    """The lease's end and its event in one statement, built once (the caller holds the lease's
    row lock): a job's restart releases as many leases as it took, each a round trip less."""
    lease_id = bindparam("lease_id", type_=BigInteger)
    table = cast(Table, RestoreLease.__table__)
    released = (
        update(table)
        .where(table.c.id == lease_id)
        .values(released_at=func.now())
        .returning(table.c.released_at)
        .cte("released")
    )
    event = insert(Event).from_select(
        ["kind", "checkpoint_id", "job_id", "actor", "detail"],
        select(
            literal(EventKind.LEASED.value),
            # Not named for a column of the lease: an UPDATE would take such a parameter as a
            # value to SET.
            bindparam("event_checkpoint", type_=BigInteger),
            bindparam("job_id", type_=BigInteger),
            bindparam("actor", type_=String),
            func.jsonb_build_object("action", "released", "lease_id", lease_id),
        ).select_from(released),
    )
    return select(released.c.released_at).add_cte(event.cte("event"))


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
    lease, job_id, lapsed, now = _lease_locked(session, job, step, lease_id)
    if lease.released_at is not None or lapsed:
        what = "released" if lease.released_at is not None else "expired"
        raise LeaseEnded(
            f"lease {lease_id} has {what}; take a new lease (POST .../leases)",
            extra={"lease_id": lease_id},
        )
    expires_at = now + timedelta(seconds=ttl_seconds)
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
    lease, job_id, lapsed, _ = _lease_locked(session, job, step, lease_id)
    if lease.released_at is not None:
        return _view(lease, job, step, lapsed), False
    params = {
        "lease_id": lease_id,
        "event_checkpoint": lease.checkpoint_id,
        "job_id": job_id,
        "actor": actor,
    }
    released_at = session.execute(_release_statement(), params).scalar_one()
    # What the statement wrote, known to the session without an UPDATE of its own at commit.
    set_committed_value(lease, "released_at", released_at)
    return _view(lease, job, step, lapsed), True


def list_leases(
    session: Session,
    job: str,
    step: int,
    *,
    include_ended: bool = False,
    branch: int | None = None,
    after: int | None = None,
    limit: int | None = None,
) -> list[LeaseView]:
    """The checkpoint's leases in id order: those with an id after `after`, at most `limit`
    (keyset paging: a storm's checkpoint holds thousands)."""
    checkpoint = find_checkpoint(session, job, step, branch=branch)
    lapsed = RestoreLease.expires_at <= func.now()
    q = select(RestoreLease, lapsed).where(RestoreLease.checkpoint_id == checkpoint.id)
    if not include_ended:
        q = q.where(RestoreLease.released_at.is_(None), ~lapsed)
    if after is not None:
        q = q.where(RestoreLease.id > after)
    if limit is not None:
        q = q.limit(limit)
    rows = session.execute(q.order_by(RestoreLease.id)).all()
    return [_view(r[0], job, step, bool(r[1])) for r in rows]


def still_leased(session: Session, lease_id: int) -> bool:
    """Whether the checkpoint of lease `lease_id` has an active lease (that one included). Read
    after a release commits, by the releaser: of releases committing together, the last to commit
    reads after every other one's commit, so at least one of them finds the checkpoint unleased."""
    other = aliased(RestoreLease)
    held = exists().where(
        RestoreLease.id == lease_id,
        other.checkpoint_id == RestoreLease.checkpoint_id,
        other.released_at.is_(None),
        other.expires_at > func.now(),
    )
    return bool(session.scalar(select(held)))
