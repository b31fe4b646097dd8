"""Branches and rollbacks on a real catalog: a rollback starts a branch from a restorable step on
the timeline and supersedes what came after it; the same caller's retry is answered with the
same branch, a rival's is refused naming the winner; a step that is superseded, in the future,
missing or not restorable is refused; and a branch's timeline runs back through its parents."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.catalog.timeline.branches import (
    branch_segments,
    list_branches,
    rollback,
    step_dir,
)
from tierpoint.errors import (
    BranchNotFound,
    CheckpointNotFound,
    CheckpointSuperseded,
    JobNotFound,
    NotRestorable,
    RollbackConflict,
    RollbackToFuture,
)


def _job_with_steps(session: Session, *steps: int) -> Job:
    job = job_row(session)
    for step in steps:
        cp = checkpoint_row(session, job.id, step)
        session.execute(
            update(TierCopy).where(TierCopy.checkpoint_id == cp).values(state="restorable")
        )
    return job


def test_a_rollback_starts_a_branch_and_supersedes_what_came_after(session: Session) -> None:
    job = _job_with_steps(session, 1, 2, 3)
    done = rollback(session, job.name, 2, from_branch=1, reason="loss spike", actor="alice")
    assert done.created and done.superseded == [3]
    assert (done.branch.number, done.branch.parent, done.branch.from_step) == (2, 1, 2)
    assert done.branch.current and done.branch.step_dir == "{step}.b2"
    assert session.scalar(select(Job.current_branch).where(Job.id == job.id)) == 2
    steps = session.execute(
        select(Checkpoint.step, Checkpoint.superseded_by).where(Checkpoint.job_id == job.id)
    ).all()
    assert sorted(tuple(s) for s in steps) == [(1, None), (2, None), (3, 2)]
    current, branches = list_branches(session, job.name)
    assert current == 2
    assert [(b.number, b.current, b.step_dir) for b in branches] == [
        (1, False, "{step}"),
        (2, True, "{step}.b2"),
    ]

    # The same caller's retry gets the same branch; a rival from the old branch is refused.
    again = rollback(session, job.name, 2, from_branch=1, reason="loss spike", actor="alice")
    assert (again.created, again.branch.number, again.superseded) == (False, 2, [])
    with pytest.raises(RollbackConflict, match="won: branch 2, by alice") as lost:
        rollback(session, job.name, 2, from_branch=1, reason=None, actor="bob")
    assert lost.value.extra is not None and lost.value.extra["winner"]["number"] == 2
    with pytest.raises(RollbackConflict, match="is on branch 2, not 1"):
        rollback(session, job.name, 1, from_branch=1, reason=None, actor="bob")


def test_a_rollback_to_a_step_it_cannot_use_is_refused(session: Session) -> None:
    job = _job_with_steps(session, 1, 2, 4)
    pending = checkpoint_row(session, job.id, 5)  # its only copy is still being made
    rollback(session, job.name, 2, from_branch=None, reason=None, actor="alice")
    with pytest.raises(CheckpointSuperseded, match="superseded by the rollback that started"):
        rollback(session, job.name, 4, from_branch=None, reason=None, actor="alice")
    with pytest.raises(RollbackToFuture):
        rollback(session, job.name, 9, from_branch=None, reason=None, actor="alice")
    with pytest.raises(CheckpointNotFound):
        rollback(session, job.name, 0, from_branch=None, reason=None, actor="alice")
    with pytest.raises(JobNotFound):
        rollback(session, f"{job.name}-none", 1, from_branch=None, reason=None, actor="alice")
    session.execute(
        update(Checkpoint).where(Checkpoint.id == pending).values(superseded_by=None, branch=2)
    )
    with pytest.raises(NotRestorable, match="no tier holds a restorable copy"):
        rollback(session, job.name, 5, from_branch=None, reason=None, actor="alice")


def test_a_branchs_timeline_runs_back_through_its_parents(session: Session) -> None:
    job = _job_with_steps(session, 1, 2, 3)
    assert branch_segments(session, job.id, 1) == [(1, None)]  # no branch row yet
    rollback(session, job.name, 2, from_branch=None, reason=None, actor="alice")
    rollback(session, job.name, 1, from_branch=None, reason=None, actor="alice")
    assert branch_segments(session, job.id, 3) == [(3, None), (2, 1), (1, 1)]
    assert branch_segments(session, job.id, 2) == [(2, None), (1, 2)]
    with pytest.raises(BranchNotFound):
        branch_segments(session, job.id, 4)
    assert step_dir(1) == "{step}" and step_dir(12) == "{step}.b12"
