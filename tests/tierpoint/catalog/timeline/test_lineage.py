"""Lineage and forks on a real catalog: a checkpoint's ancestry runs parent first to its root,
across jobs, and its descendants come breadth first up to a limit; a fork starts a new job from a
restorable checkpoint once (the same fork again is answered, another refused), and never from
the job itself or one of its descendants."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.catalog.timeline.lineage import fork, lineage
from tierpoint.errors import JobExists, LineageCycle, NotRestorable


def _restorable(session: Session, job: Job, step: int, parent: int | None = None) -> int:
    cp = checkpoint_row(session, job.id, step)
    session.execute(update(TierCopy).where(TierCopy.checkpoint_id == cp).values(state="restorable"))
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(parent_id=parent))
    return cp


def test_ancestry_and_descendants_across_jobs(session: Session) -> None:
    base, child = job_row(session), job_row(session)
    one = _restorable(session, base, 1)
    two = _restorable(session, base, 2, parent=one)
    three = _restorable(session, base, 3, parent=two)
    other = _restorable(session, child, 10, parent=two)  # another job's run loaded step 2

    view = lineage(session, base.name, 3)
    assert view.checkpoint.id == three
    assert [n.id for n in view.ancestors] == [two, one]
    assert view.descendants == [] and not view.truncated

    view = lineage(session, base.name, 1)
    assert view.ancestors == []
    assert view.descendants[0].id == two  # breadth first: the child before its children
    assert {n.id for n in view.descendants} == {two, three, other}
    assert [n.job for n in lineage(session, child.name, 10).ancestors] == [base.name, base.name]

    limited = lineage(session, base.name, 1, limit=1)
    assert [n.id for n in limited.descendants] == [two] and limited.truncated


def test_a_fork_starts_a_new_job_once_and_never_closes_a_cycle(session: Session) -> None:
    base = job_row(session)
    start = _restorable(session, base, 5)
    name = f"fork-{uuid.uuid4().hex[:8]}"
    made = fork(session, name, base.name, 5, parent_branch=None, actor="alice")
    assert (made.created, made.parent_id, made.created_by) == (True, start, "alice")
    again = fork(session, name, base.name, 5, parent_branch=None, actor="bob")
    assert (again.created, again.created_by, again.created_at) == (False, "alice", made.created_at)

    _restorable(session, base, 6)
    with pytest.raises(JobExists):
        fork(session, name, base.name, 6, parent_branch=None, actor="alice")
    forked = session.scalars(select(Job).where(Job.name == name)).one()
    _restorable(session, forked, 1)
    # The base job cannot start from its own fork: a cycle of forks.
    with pytest.raises(LineageCycle, match="one of its descendants"):
        fork(session, base.name, name, 1, parent_branch=None, actor="alice")
    with pytest.raises(LineageCycle, match="the same job"):
        fork(session, base.name, base.name, 5, parent_branch=None, actor="alice")
    checkpoint_row(session, base.id, 7)  # its only copy is still being made
    with pytest.raises(NotRestorable):
        fork(session, f"fork-{uuid.uuid4().hex[:8]}", base.name, 7, parent_branch=None, actor="a")
