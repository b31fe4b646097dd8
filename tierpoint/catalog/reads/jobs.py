"""Reads behind the jobs endpoint: a page of jobs, each with its checkpoint count and the newest
step of its timeline. Reads only."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.catalog.reads.views import JobView


def list_jobs(
    session: Session, *, limit: int = 100, after_name: str | None = None
) -> tuple[list[JobView], str | None]:
    count = select(func.count()).where(Checkpoint.job_id == Job.id).correlate(Job).scalar_subquery()
    # The newest step of the job's timeline: a rollback's superseded steps are not its progress.
    latest = (
        select(func.max(Checkpoint.step))
        .where(Checkpoint.job_id == Job.id, Checkpoint.superseded_by.is_(None))
        .correlate(Job)
        .scalar_subquery()
    )
    q = select(Job.name, Job.created_at, count.label("n"), latest.label("latest")).order_by(
        Job.name
    )
    if after_name is not None:
        q = q.where(Job.name > after_name)
    rows = session.execute(q.limit(limit + 1)).all()
    jobs = [JobView(r.name, r.created_at, r.n, r.latest) for r in rows[:limit]]
    return jobs, (rows[limit - 1].name if len(rows) > limit else None)
