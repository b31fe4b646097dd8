"""Jobs and their checkpoints by name on a real catalog: (job, step) found with or without its
row lock, the two refusals told apart (no such job, no such step), job names paged by key, and a
checkpoint's head and name read by id."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import (
    CheckpointHead,
    CheckpointKey,
    checkpoint_head,
    checkpoint_names,
    find_checkpoint,
    job_names,
    require_job_id,
)
from tierpoint.catalog.locks import ACTION_LOCK, LEASE_LOCK
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.errors import CheckpointNotFound, JobNotFound


def _job(session: Session, name: str) -> int:
    job_id: int | None = session.scalar(insert(Job).values(name=name).returning(Job.id))
    assert job_id is not None
    return job_id


def _checkpoint(session: Session, job_id: int, step: int, *, pinned: bool = False) -> int:
    cp: int | None = session.scalar(
        insert(Checkpoint)
        .values(
            job_id=job_id,
            step=step,
            total_bytes=100 + step,
            shard_count=2,
            manifest_digest="d",
            pinned=pinned,
        )
        .returning(Checkpoint.id)
    )
    assert cp is not None
    return cp


def test_a_checkpoint_is_found_by_job_and_step_or_refused_saying_which_is_missing(
    session: Session,
) -> None:
    job = f"job-{uuid.uuid4().hex[:10]}"
    job_id = _job(session, job)
    cp = _checkpoint(session, job_id, 3, pinned=True)
    expected = CheckpointKey(cp, job_id, True)
    assert find_checkpoint(session, job, 3) == expected
    assert find_checkpoint(session, job, 3, lock=ACTION_LOCK) == expected
    assert find_checkpoint(session, job, 3, lock=LEASE_LOCK) == expected
    for lock in (None, ACTION_LOCK, LEASE_LOCK):
        with pytest.raises(CheckpointNotFound, match=f"job '{job}' has no checkpoint at step 4"):
            find_checkpoint(session, job, 4, lock=lock)
        with pytest.raises(JobNotFound, match="no job named 'no-such-job'"):
            find_checkpoint(session, "no-such-job", 3, lock=lock)
    assert require_job_id(session, job) == job_id


def test_job_names_page_by_key_in_name_order(session: Session) -> None:
    prefix = f"page-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{c}" for c in "dbca"]
    for name in names:
        _job(session, name)
    ordered = sorted(names)
    assert job_names(session, after=prefix, limit=2) == ordered[:2]
    assert job_names(session, after=ordered[1], limit=2) == ordered[2:]
    assert job_names(session, after=ordered[-1], limit=2) == []
    assert job_names(session, only=ordered[2]) == [ordered[2]]
    assert job_names(session, only=f"{prefix}-none") == []


def test_a_checkpoints_head_and_name_by_id(session: Session) -> None:
    job = f"job-{uuid.uuid4().hex[:10]}"
    job_id = _job(session, job)
    first, second = _checkpoint(session, job_id, 1), _checkpoint(session, job_id, 2)
    assert checkpoint_head(session, second) == CheckpointHead(second, job_id, job, 2, 2, 102)
    missing = second + 10**9
    assert checkpoint_head(session, missing) is None
    assert sorted(checkpoint_names(session, [first, second, missing])) == [
        (first, job, 1, 1),
        (second, job, 2, 1),
    ]
