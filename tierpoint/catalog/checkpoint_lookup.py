"""Finding a checkpoint by what its callers name it by, (job name, step), and the two refusals
that go with it. Every route and service that takes a job and a step asks here, so a missing job
and a missing checkpoint read the same wherever they are refused."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.errors import CheckpointNotFound, JobNotFound

from .models import Checkpoint, Job


class CheckpointKey(NamedTuple):
    id: int
    job_id: int
    pinned: bool


def no_job(job: str) -> JobNotFound:
    return JobNotFound(f"no job named {job!r}")


def no_checkpoint(job: str, step: int) -> CheckpointNotFound:
    return CheckpointNotFound(f"job {job!r} has no checkpoint at step {step}")


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


def find_checkpoint(session: Session, job: str, step: int, *, lock: bool = False) -> CheckpointKey:
    """The checkpoint at (job, step), its row locked until commit with `lock`. Raises JobNotFound
    when no job has that name, else CheckpointNotFound.

    The lock is FOR NO KEY UPDATE: it orders the caller with every other holder of the row
    (another action, the retention executor's FOR UPDATE) but not with foreign-key checks. The
    store's writers lock a marker and then record an event, whose foreign key takes KEY SHARE on
    this row; a caller that then waits for that marker while holding the row FOR UPDATE would
    close a cycle, and Postgres would end one side as deadlocked."""
    q = (
        select(Checkpoint.id, Checkpoint.job_id, Checkpoint.pinned)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.name == job, Checkpoint.step == step)
    )
    if lock:
        # key_share=True renders FOR NO KEY UPDATE (FOR KEY SHARE only with read=True).
        q = q.with_for_update(of=Checkpoint, key_share=True)
    row = session.execute(q).one_or_none()
    if row is None:
        # Only the refusal pays for the second lookup; the hot path is one indexed join.
        require_job_id(session, job)
        raise no_checkpoint(job, step)
    return CheckpointKey(row.id, row.job_id, row.pinned)
