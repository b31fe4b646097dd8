"""Jobs, and their checkpoints by what callers name them by, (job name, step), with the two
refusals that go with it. Every route and service that takes a job and a step asks here, so a
missing job and a missing checkpoint read the same wherever they are refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.orm import Session

from tierpoint.catalog.locks import CheckpointAt, RowLock, lock_in_order
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.errors import CheckpointNotFound, JobNotFound


class CheckpointKey(NamedTuple):
    id: int
    job_id: int
    pinned: bool


def no_job(job: str) -> JobNotFound:
    return JobNotFound(f"no job named {job!r}")


def no_checkpoint(job: str, step: int, branch: int | None = None) -> CheckpointNotFound:
    on = "" if branch is None else f" on branch {branch}"
    return CheckpointNotFound(f"job {job!r} has no checkpoint at step {step}{on}")


def job_id_by_name(session: Session, job: str) -> int | None:
    return session.scalar(select(Job.id).where(Job.name == job))


def require_job_id(session: Session, job: str) -> int:
    """The job's id; raises JobNotFound. (The API calls it through `AsyncSession.run_sync`.)"""
    job_id = job_id_by_name(session, job)
    if job_id is None:
        raise no_job(job)
    return job_id


def job_id_of_checkpoint(session: Session, checkpoint_id: int) -> int | None:
    return session.scalar(select(Checkpoint.job_id).where(Checkpoint.id == checkpoint_id))


def find_checkpoint(
    session: Session,
    job: str,
    step: int,
    *,
    lock: RowLock | None = None,
    branch: int | None = None,
) -> CheckpointKey:
    """The checkpoint at (job, step) (`locks.at_step`: on `branch` when given, else the one on
    the timeline, else the newest superseded one), its row locked in mode `lock` until commit
    (through `locks.lock_in_order`). Raises JobNotFound when no job has that name, else
    CheckpointNotFound."""
    at = CheckpointAt(job, step, branch)
    held = lock_in_order(session, checkpoints=at, checkpoint_lock=lock).checkpoints
    found = next(iter(held.values()), None)
    key = None if found is None else CheckpointKey(found.id, found.job_id, found.pinned)
    if key is None:
        # Only the refusal pays for the second lookup; the hot path is one indexed join.
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    return key


def job_names(
    session: Session, *, after: str | None = None, limit: int | None = None, only: str | None = None
) -> list[str]:
    """Job names in name order: those after `after`, at most `limit` (keyset paging, as the
    retention sweep pages), or only `only` when such a job exists (one job's reconciliation)."""
    stmt = select(Job.name).order_by(Job.name)
    if after is not None:
        stmt = stmt.where(Job.name > after)
    if only is not None:
        stmt = stmt.where(Job.name == only)
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(session.scalars(stmt))


def checkpoint_names(
    session: Session, checkpoint_ids: Sequence[int]
) -> list[tuple[int, str, int, int]]:
    """(checkpoint id, job name, step, branch) of each of `checkpoint_ids` that exists."""
    rows = session.execute(
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id.in_(list(checkpoint_ids)))
    ).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


class CheckpointName(NamedTuple):
    """What a checkpoint's files are named by on every tier."""

    job: str
    step: int
    branch: int


def undeleted_checkpoint_name(session: Session, checkpoint_id: int) -> CheckpointName | None:
    """The checkpoint's name; None once it is deleted (or if it never was)."""
    row = session.execute(
        select(Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Checkpoint.deleted_at.is_(None))
    ).one_or_none()
    return None if row is None else CheckpointName(row.name, row.step, row.branch)


@dataclass(frozen=True)
class CheckpointHead:
    id: int
    job_id: int
    job: str
    step: int
    shard_count: int
    total_bytes: int


def head_query(checkpoint_id: int, *extra: ColumnElement[Any]) -> Select[Any]:
    """The columns of a CheckpointHead, in its order, then `extra`."""
    return (
        select(
            Checkpoint.id,
            Checkpoint.job_id,
            Job.name,
            Checkpoint.step,
            Checkpoint.shard_count,
            Checkpoint.total_bytes,
            *extra,
        )
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id)
    )


def checkpoint_head(session: Session, checkpoint_id: int) -> CheckpointHead | None:
    row = session.execute(head_query(checkpoint_id)).one_or_none()
    return None if row is None else CheckpointHead(*row)
