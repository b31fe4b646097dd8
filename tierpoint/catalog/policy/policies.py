"""Retention policies in the catalog: create, revise (version + 1), delete, make default, assign
to jobs. Every change is recorded as a `policy_changed` event with its actor, and revisions carry
the old and the new document, so the events are the policy's version history.

Callers validate the document (`Policy.from_spec` and `check_tiers`) before calling in here and
commit afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.models import Branch, Event, Job, RetentionPolicy
from tierpoint.catalog.policy.assigned import BUILTIN_POLICY_NAME
from tierpoint.errors import PolicyConflict, PolicyExists, PolicyInUse, PolicyNotFound
from tierpoint.retention.policy import DEFAULT_POLICY, Policy


@dataclass
class PolicyRecord:
    name: str
    version: int
    spec: dict[str, Any]
    default: bool
    jobs: int  # jobs assigned to it by name (not counting those that use it as the default)
    created_at: datetime | None  # None: the built-in policy, never stored
    updated_at: datetime | None


@dataclass
class PolicyChange:
    id: int
    at: datetime
    actor: str | None
    job: str | None
    detail: dict[str, Any]


def _record(row: RetentionPolicy, jobs: int) -> PolicyRecord:
    return PolicyRecord(
        row.name, row.version, row.spec, row.is_default, jobs, row.created_at, row.updated_at
    )


def _jobs_using(session: Session, policy_id: int) -> int:
    n = session.scalar(select(func.count()).where(Job.policy_id == policy_id))
    return int(n or 0)


def _locked(session: Session, name: str) -> RetentionPolicy:
    row = session.scalar(
        select(RetentionPolicy).where(RetentionPolicy.name == name).with_for_update()
    )
    if row is None:
        raise PolicyNotFound(f"no retention policy named {name!r}")
    return row


def _event(session: Session, actor: str, job_id: int | None = None, **detail: Any) -> None:
    record(session, EventKind.POLICY_CHANGED, job_id=job_id, actor=actor, detail=detail)


def _default_race() -> PolicyConflict:
    # Only the one-default index can be violated here: another request made a policy the default
    # at the same moment, when there was none to lock.
    return PolicyConflict("another policy became the default at the same time; retry")


def _take_default(session: Session, name: str, actor: str) -> None:
    """Clear the current default (if another policy holds it) so that `name` can take it; the
    partial unique index allows one default, and the row lock orders concurrent takers."""
    current = session.scalar(
        select(RetentionPolicy).where(RetentionPolicy.is_default).with_for_update()
    )
    if current is not None and current.name != name:
        current.is_default = False
        current.updated_at = func.now()
        _event(session, actor, action="default_unset", policy=current.name, version=current.version)


def create_policy(
    session: Session, name: str, policy: Policy, *, default: bool, actor: str
) -> PolicyRecord:
    if name == BUILTIN_POLICY_NAME:
        raise PolicyExists(f"{name!r} is the name of the built-in policy")
    spec = policy.to_spec()
    if default:
        _take_default(session, name, actor)
    try:
        inserted = session.scalar(
            pg_insert(RetentionPolicy)
            .values(name=name, spec=spec, version=1, is_default=default)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(RetentionPolicy.id)
        )
    except IntegrityError:
        raise _default_race() from None
    if inserted is None:
        raise PolicyExists(
            f"a retention policy named {name!r} exists; PUT /v1/policies/{name} revises it"
        )
    _event(
        session,
        actor,
        action="created",
        policy=name,
        version=1,
        old_spec=None,
        new_spec=spec,
        default=default,
    )
    row = session.get_one(RetentionPolicy, inserted)
    session.refresh(row)
    return _record(row, 0)


def list_policies(session: Session) -> list[PolicyRecord]:
    jobs = (
        select(func.count())
        .where(Job.policy_id == RetentionPolicy.id)
        .correlate(RetentionPolicy)
        .scalar_subquery()
    )
    rows = (
        session.execute(select(RetentionPolicy, jobs.label("jobs")).order_by(RetentionPolicy.name))
    ).all()
    return [_record(r[0], int(r[1])) for r in rows]


def get_policy(session: Session, name: str) -> PolicyRecord:
    """A stored policy, or the built-in one by its name (what jobs run under while the catalog
    has no default: `usage` and the retention plan name it, so it must be readable too)."""
    row = session.scalar(select(RetentionPolicy).where(RetentionPolicy.name == name))
    if row is None and name == BUILTIN_POLICY_NAME:
        has_default = session.scalar(select(exists().where(RetentionPolicy.is_default)))
        return PolicyRecord(
            name, 1, DEFAULT_POLICY.to_spec(), not has_default, 0, created_at=None, updated_at=None
        )
    if row is None:
        raise PolicyNotFound(f"no retention policy named {name!r}")
    return _record(row, _jobs_using(session, row.id))


def update_policy(
    session: Session, name: str, policy: Policy, *, default: bool | None, actor: str
) -> tuple[PolicyRecord, bool]:
    """Replace the document: a different one is a new version (version + 1, event with the old and
    new document); the same one changes nothing. `default` True/False makes it (no longer) the
    default; None leaves that alone. Returns the policy and whether its document changed."""
    row = _locked(session, name)
    spec = policy.to_spec()
    changed = spec != row.spec
    if changed:
        old = row.spec
        row.spec = spec
        row.version += 1
        row.updated_at = func.now()
        _event(
            session,
            actor,
            action="revised",
            policy=name,
            version=row.version,
            old_spec=old,
            new_spec=spec,
        )
    if default is not None and default != row.is_default:
        if default:
            _take_default(session, name, actor)
            session.flush()
        row.is_default = default
        row.updated_at = func.now()
        try:
            session.flush()
        except IntegrityError:
            raise _default_race() from None
        _event(
            session,
            actor,
            action="default_set" if default else "default_unset",
            policy=name,
            version=row.version,
        )
    session.flush()
    session.refresh(row)
    return _record(row, _jobs_using(session, row.id)), changed


def delete_policy(session: Session, name: str, *, actor: str) -> None:
    row = _locked(session, name)
    if row.is_default:
        raise PolicyInUse(
            f"{name!r} is the default policy; make another policy the default "
            f"(or PUT it with default=false) first"
        )
    # Locks the assigned jobs' rows so that no assignment slips in before the delete (the foreign
    # key would refuse it anyway).
    jobs = (
        session.scalars(
            select(Job.name).where(Job.policy_id == row.id).order_by(Job.name).with_for_update()
        )
    ).all()
    if jobs:
        shown = ", ".join(jobs[:10]) + (f" and {len(jobs) - 10} more" if len(jobs) > 10 else "")
        raise PolicyInUse(
            f"{name!r} is assigned to {len(jobs)} job(s): {shown}", extra={"jobs": list(jobs[:100])}
        )
    _event(
        session,
        actor,
        action="deleted",
        policy=name,
        version=row.version,
        old_spec=row.spec,
        new_spec=None,
    )
    session.delete(row)
    try:
        session.flush()
    except IntegrityError:
        raise PolicyInUse(f"{name!r} was assigned to a job while it was being deleted") from None


def assign_policy(
    session: Session, job: str, name: str | None, *, actor: str
) -> tuple[str | None, str | None]:
    """Make `name` the job's policy (None: the default policy). The job row is created if the job
    has not registered a checkpoint yet, so a policy can be set before training starts.
    Returns (previous policy name, new policy name)."""
    new_id: int | None = None
    version: int | None = None
    if name is not None:
        # Shared lock: the policy cannot be deleted until this assignment commits.
        pol = (
            session.execute(
                select(RetentionPolicy.id, RetentionPolicy.version)
                .where(RetentionPolicy.name == name)
                .with_for_update(read=True)
            )
        ).one_or_none()
        if pol is None:
            raise PolicyNotFound(f"no retention policy named {name!r}")
        new_id, version = pol.id, pol.version
    made = session.scalar(
        pg_insert(Job).values(name=job).on_conflict_do_nothing().returning(Job.id)
    )
    if made is not None:
        # Every job starts on branch 1 of its timeline (docs/timeline.md).
        session.execute(pg_insert(Branch).values(job_id=made, number=1).on_conflict_do_nothing())
    job_row = session.scalar(select(Job).where(Job.name == job).with_for_update())
    assert job_row is not None
    previous = (
        session.scalar(select(RetentionPolicy.name).where(RetentionPolicy.id == job_row.policy_id))
        if job_row.policy_id is not None
        else None
    )
    if job_row.policy_id != new_id:
        job_row.policy_id = new_id
        _event(
            session,
            actor,
            job_id=job_row.id,
            action="assigned",
            job=job,
            policy=name,
            version=version,
            previous=previous,
        )
        session.flush()
    return previous, name


def assigned_jobs(session: Session, name: str) -> list[str]:
    """Jobs whose retention a change to `name` affects: those assigned to it, and for the default
    policy also those without a policy of their own."""
    row = session.scalar(select(RetentionPolicy).where(RetentionPolicy.name == name))
    if row is None:
        return []
    cond = Job.policy_id == row.id
    if row.is_default:
        cond = cond | Job.policy_id.is_(None)
    return list(session.scalars(select(Job.name).where(cond).order_by(Job.name)).all())


def history(session: Session, name: str, *, limit: int = 100) -> list[PolicyChange]:
    """The policy's changes, newest first: creation, revisions (with old and new document),
    default changes, assignments to jobs, deletion. Kept after a delete (a name can be reused)."""
    rows = (
        session.execute(
            select(Event.id, Event.created_at, Event.actor, Event.detail, Job.name)
            .outerjoin(Job, Job.id == Event.job_id)
            .where(
                Event.kind == EventKind.POLICY_CHANGED.value,
                (Event.detail["policy"].astext == name) | (Event.detail["previous"].astext == name),
            )
            .order_by(Event.id.desc())
            .limit(limit)
        )
    ).all()
    return [PolicyChange(r.id, r.created_at, r.actor, r.name, r.detail) for r in rows]
