"""The jobs endpoint's read on a real catalog: a page of jobs by name with its cursor, each with
its checkpoint count and the newest step of its timeline (not a step a rollback superseded)."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import supersede
from tierpoint.catalog.models import Job
from tierpoint.catalog.reads.jobs import list_jobs


def _named(session: Session, name: str) -> Job:
    job = job_row(session)
    job.name = name
    session.flush()
    return job


def test_jobs_are_paged_by_name(session: Session) -> None:
    p = f"jobs{uuid.uuid4().hex[:8]}"
    for suffix in ("c", "a", "b"):
        _named(session, f"{p}-{suffix}")

    # Starting just before the names: the page holds only this test's jobs, by name.
    first, cursor = list_jobs(session, limit=2, after_name=p)
    assert ([j.name for j in first], cursor) == ([f"{p}-a", f"{p}-b"], f"{p}-b")
    rest, _ = list_jobs(session, limit=2, after_name=cursor)
    assert rest[0].name == f"{p}-c"


def test_a_job_counts_every_checkpoint_and_its_latest_step_is_its_timelines(
    session: Session,
) -> None:
    p = f"jobs{uuid.uuid4().hex[:8]}"
    job = _named(session, f"{p}-a")
    checkpoint_row(session, job.id, 10)
    old = [checkpoint_row(session, job.id, s) for s in (20, 30)]
    supersede(session, job.id, old, 10, 2, actor=None)
    checkpoint_row(session, job.id, 20, branch=2)
    _named(session, f"{p}-b")

    page, _ = list_jobs(session, limit=2, after_name=p)
    # The superseded step 30 is counted (still listed) but is not the job's progress.
    assert [(j.name, j.checkpoint_count, j.latest_step) for j in page] == [
        (f"{p}-a", 4, 20),
        (f"{p}-b", 0, None),
    ]
