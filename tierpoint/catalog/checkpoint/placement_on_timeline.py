"""Where a registration goes on its job's timeline: the branch it is saved on and the checkpoint
it descends from (docs/timeline.md). Part of registration's one transaction."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.errors import (
    BranchNotFound,
    BranchSuperseded,
    CheckpointNotFound,
    JobNotFound,
    LineageCycle,
    UnknownParent,
)
from tierpoint.manifest import Manifest


def branch_to_save_on(session: Session, job: str, job_id: int, asked: int | None) -> int:
    """The job's current branch, read under a share lock on the job's row: a rollback takes it
    FOR NO KEY UPDATE, which conflicts with it, so a registration either commits before a
    rollback supersedes (and is superseded with the rest) or sees the new branch. A writer that
    names a branch no longer current is refused: it still runs on a timeline that a rollback
    left."""
    current = session.scalar(
        select(Job.current_branch).where(Job.id == job_id).with_for_update(read=True)
    )
    assert current is not None
    # guard: register-on-left-branch
    if asked is None or asked == current:
        return int(current)
    if asked > current:
        raise BranchNotFound(
            f"job {job!r} has no branch {asked} (its current branch is {current})",
            extra={"current_branch": current},
        )
    raise BranchSuperseded(
        f"branch {asked} of job {job!r} is no longer current: a rollback started branch "
        f"{current}; load its latest and save there",
        extra={"current_branch": current},
    )


def parent_of(session: Session, job: str, job_id: int, manifest: Manifest) -> int | None:
    """The checkpoint this one descends from: the one the manifest names, else the one before
    it on the job's timeline, else the job's fork parent, else none (a root)."""
    ref = manifest.parent
    if ref is not None:
        try:
            parent = find_checkpoint(session, ref.job, ref.step, branch=ref.branch)
        except (JobNotFound, CheckpointNotFound) as exc:
            raise UnknownParent(
                f"the parent {ref.job}/{ref.step} does not exist: {exc.detail}",
                errors=[
                    {
                        "field": "parent",
                        "location": "body",
                        "message": exc.detail,
                        "code": "unknown_parent",
                    }
                ],
            ) from None
        if parent.job_id == job_id:
            step = session.scalar(select(Checkpoint.step).where(Checkpoint.id == parent.id))
            if step is not None and step >= manifest.step:
                raise LineageCycle(
                    f"step {manifest.step} of job {job!r} cannot descend from its own step "
                    f"{step}: within a job a parent comes before its child",
                    extra={"parent": {"job": ref.job, "step": step}},
                )
        return parent.id
    before = session.scalar(
        select(Checkpoint.id)
        .where(
            Checkpoint.job_id == job_id,
            Checkpoint.superseded_by.is_(None),
            Checkpoint.step < manifest.step,
        )
        .order_by(Checkpoint.step.desc())
        .limit(1)
    )
    if before is not None:
        return int(before)
    fork = session.scalar(select(Job.fork_parent_id).where(Job.id == job_id))
    return None if fork is None else int(fork)
