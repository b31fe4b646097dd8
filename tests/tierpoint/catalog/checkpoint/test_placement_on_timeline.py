"""Where a registration goes on its job's timeline, on a real catalog: the branch it is saved on
(the current one; a branch a rollback left is refused, one that does not exist too) and the
checkpoint it descends from (the named parent, else the timeline's previous step, else the
job's fork parent)."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.placement_on_timeline import branch_to_save_on, parent_of
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.errors import BranchNotFound, BranchSuperseded, LineageCycle, UnknownParent
from tierpoint.manifest import Manifest, ParentRef, ShardSpec


def _manifest(step: int, parent: ParentRef | None = None) -> Manifest:
    shard = ShardSpec(path="model.bin", size=1, crc32c=None, node="node-a")
    return Manifest(step=step, shards=[shard], parent=parent)


def test_a_registration_is_saved_on_the_current_branch_only(session: Session) -> None:
    job = job_row(session)
    session.execute(update(Job).where(Job.id == job.id).values(current_branch=3))
    assert branch_to_save_on(session, job.name, job.id, None) == 3
    assert branch_to_save_on(session, job.name, job.id, 3) == 3
    with pytest.raises(BranchSuperseded, match=r"branch 2 .* is no longer current") as left:
        branch_to_save_on(session, job.name, job.id, 2)
    assert left.value.extra == {"current_branch": 3}
    with pytest.raises(BranchNotFound, match="has no branch 4"):
        branch_to_save_on(session, job.name, job.id, 4)


def test_the_parent_is_the_named_one_else_the_timelines_previous_else_the_fork(
    session: Session,
) -> None:
    origin = job_row(session)
    fork_point = checkpoint_row(session, origin.id, 7)
    job = job_row(session)
    # A root: nothing before it, no fork.
    assert parent_of(session, job.name, job.id, _manifest(1)) is None
    session.execute(update(Job).where(Job.id == job.id).values(fork_parent_id=fork_point))
    assert parent_of(session, job.name, job.id, _manifest(1)) == fork_point

    one = checkpoint_row(session, job.id, 1)
    two = checkpoint_row(session, job.id, 2)
    # The previous step on the timeline; a superseded one is not on it.
    session.execute(update(Checkpoint).where(Checkpoint.id == two).values(superseded_by=2))
    assert parent_of(session, job.name, job.id, _manifest(5)) == one
    # A named parent wins, in this job or another.
    superseded_two = ParentRef(job=job.name, step=2)
    assert parent_of(session, job.name, job.id, _manifest(5, superseded_two)) == two
    named = ParentRef(job=origin.name, step=7)
    assert parent_of(session, job.name, job.id, _manifest(5, named)) == fork_point


def test_a_parent_that_is_missing_or_not_before_the_child_is_refused(session: Session) -> None:
    job = job_row(session)
    checkpoint_row(session, job.id, 4)
    with pytest.raises(UnknownParent, match="does not exist") as unknown:
        parent_of(session, job.name, job.id, _manifest(5, ParentRef(job=job.name, step=3)))
    assert [e["code"] for e in unknown.value.errors or []] == ["unknown_parent"]
    with pytest.raises(UnknownParent):
        parent_of(session, job.name, job.id, _manifest(5, ParentRef(job="no-such-job", step=1)))
    for step in (4, 3):
        with pytest.raises(LineageCycle, match="cannot descend from its own step 4"):
            parent_of(session, job.name, job.id, _manifest(step, ParentRef(job=job.name, step=4)))
