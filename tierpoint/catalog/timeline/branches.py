"""Branches and rollbacks. A rollback to step S starts a new branch from S, makes it the job's
current one and supersedes the checkpoints after S on the timeline (`checkpoint/supersede.py`),
in one transaction that locks the job's row first (FOR NO KEY UPDATE): registrations read the
current branch under a share lock on it, so none lands on a timeline a rollback is leaving."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint.supersede import lock_for_rollback, supersede
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import no_checkpoint, no_job
from tierpoint.catalog.models import RESTORABLE, Branch, Checkpoint, Job, TierCopy
from tierpoint.errors import (
    BranchNotFound,
    CheckpointSuperseded,
    NotRestorable,
    RollbackConflict,
    RollbackToFuture,
)


def step_dir(branch: int) -> str:
    """How a branch names a step's directory on every tier, `{step}` standing for the step:
    as before branches on branch 1, apart on later ones (a re-saved step never shares a file
    with the one it supersedes)."""
    return "{step}" if branch == 1 else "{step}.b" + str(branch)


@dataclass(frozen=True)
class BranchView:
    number: int
    parent: int | None
    from_step: int | None
    from_checkpoint_id: int | None
    created_at: datetime
    created_by: str | None
    reason: str | None
    current: bool
    step_dir: str


@dataclass(frozen=True)
class RollbackResult:
    job: str
    created: bool
    branch: BranchView
    superseded: list[int]


def _view(b: Branch, current: int) -> BranchView:
    return BranchView(
        b.number,
        b.parent,
        b.from_step,
        b.from_checkpoint_id,
        b.created_at,
        b.created_by,
        b.reason,
        b.number == current,
        step_dir(b.number),
    )


def _branch(session: Session, job_id: int, number: int) -> Branch:
    found = session.get(Branch, (job_id, number))
    assert found is not None, "a job's current branch has a row"
    return found


def _first_branch(session: Session, job_id: int) -> None:
    """Branch 1's row, for a job made before its first registration (a policy assigned to it, a
    fork): every job is on branch 1 from the start, whoever created its row."""
    session.execute(pg_insert(Branch).values(job_id=job_id, number=1).on_conflict_do_nothing())


def list_branches(session: Session, job: str) -> tuple[int, list[BranchView]]:
    row = session.execute(
        select(Job.id, Job.current_branch, Job.created_at).where(Job.name == job)
    ).one_or_none()
    if row is None:
        raise no_job(job)
    rows = session.scalars(select(Branch).where(Branch.job_id == row.id).order_by(Branch.number))
    views = [_view(b, row.current_branch) for b in rows]
    if not views:  # a job whose row was made before its first registration: branch 1
        views = [BranchView(1, None, None, None, row.created_at, None, None, True, step_dir(1))]
    return row.current_branch, views


def branch_segments(session: Session, job_id: int, number: int) -> list[tuple[int, int | None]]:
    """Branch `number`'s own timeline as (branch, highest step taken from it) pairs: its own
    checkpoints, then those of each branch it came from up to where the next one left it."""
    rows = {b.number: b for b in session.scalars(select(Branch).where(Branch.job_id == job_id))}
    if number == 1 and not rows:
        return [(1, None)]  # a job whose row was made before its first registration
    if number not in rows:
        raise BranchNotFound(f"the job has no branch {number}", extra={"branches": len(rows)})
    out: list[tuple[int, int | None]] = []
    bound: int | None = None
    b: Branch | None = rows[number]
    while b is not None:
        out.append((b.number, bound))
        if b.from_step is not None:
            bound = b.from_step if bound is None else min(bound, b.from_step)
        b = rows.get(b.parent) if b.parent is not None else None
    return out


def _target(session: Session, job: str, job_id: int, step: int) -> Checkpoint:
    """The checkpoint a rollback goes back to, or the refusal that says why it cannot."""
    on_timeline = session.scalar(
        select(Checkpoint).where(
            Checkpoint.job_id == job_id,
            Checkpoint.step == step,
            Checkpoint.superseded_by.is_(None),
        )
    )
    if on_timeline is None:
        left = session.scalar(
            select(func.max(Checkpoint.superseded_by)).where(
                Checkpoint.job_id == job_id, Checkpoint.step == step
            )
        )
        if left is not None:
            raise CheckpointSuperseded(
                f"step {step} of job {job!r} was superseded by the rollback that started "
                f"branch {left}: roll back to a step on the timeline",
                extra={"superseded_by": left},
            )
        newest = session.scalar(
            select(func.max(Checkpoint.step)).where(
                Checkpoint.job_id == job_id, Checkpoint.superseded_by.is_(None)
            )
        )
        if newest is not None and step > newest:
            raise RollbackToFuture(
                f"step {step} is after the newest step of job {job!r}'s timeline ({newest})",
                extra={"newest_step": newest},
            )
        raise no_checkpoint(job, step)
    return on_timeline


def require_restorable(session: Session, job: str, c: Checkpoint) -> None:
    why = None
    if c.deleted_at is not None:
        why = "it was deleted"
    elif c.health == "bad":
        why = "its verdict is bad"
    elif c.quarantine_reason is not None:
        why = f"it is quarantined: {c.quarantine_reason}"
    elif not session.scalar(
        select(
            exists().where(
                TierCopy.checkpoint_id == c.id,
                TierCopy.state == RESTORABLE,
                TierCopy.quarantine_reason.is_(None),
            )
        )
    ):
        why = "no tier holds a restorable copy of it"
    # guard: rollback-target-restorable
    if why is not None:
        raise NotRestorable(
            f"cannot roll back job {job!r} to step {c.step}: {why}", extra={"why": why}
        )


def rollback(
    session: Session,
    job: str,
    step: int,
    *,
    from_branch: int | None,
    reason: str | None,
    actor: str | None,
) -> RollbackResult:
    """Go back to `step`: a new branch from it (docs/api.md, "Roll back"). Idempotent for the
    same step and caller; a rollback that lost a race is refused naming the winner."""
    # FOR NO KEY UPDATE: it serializes rollbacks and holds off registrations (which read the
    # current branch FOR SHARE), but not the foreign-key checks of the job's other writers: a
    # promotion holds its tier copy and then records its event (KEY SHARE on this row), while a
    # rollback holding the row FOR UPDATE waited for that tier copy (a deadlock; a 503).
    row = session.execute(
        # guard: rollback-job-lock-no-key-update
        select(Job.id, Job.current_branch).where(Job.name == job).with_for_update(key_share=True)
    ).one_or_none()
    if row is None:
        raise no_job(job)
    job_id, current = row.id, row.current_branch
    _first_branch(session, job_id)
    head = _branch(session, job_id, current)
    # The same step again is a retry of the rollback that made the current branch only while
    # nothing was saved on that branch since: once the run has trained on and saved, going
    # back to the step again is a new rollback (or, naming the branch it left, a late one).
    if (
        head.parent is not None
        and head.from_step == step
        and from_branch != current
        # guard: rollback-retry-only-before-saves
        and not _saved_since(session, job_id, current, step)
    ):
        # guard: rollback-race-loser
        if head.created_by == actor and from_branch in (None, head.parent):
            return RollbackResult(job, False, _view(head, current), [])
        raise RollbackConflict(
            f"another rollback of job {job!r} to step {step} won: branch {current}, by "
            f"{head.created_by}",
            extra={"winner": _winner(head, current)},
        )
    if from_branch is not None and from_branch != current:
        raise RollbackConflict(
            f"job {job!r} is on branch {current}, not {from_branch}: another rollback (to step "
            f"{head.from_step}, by {head.created_by}) won; load its latest and decide again",
            extra={"winner": _winner(head, current)},
        )
    target = _target(session, job, job_id, step)
    after = lock_for_rollback(session, job_id, step, target.id)
    # Judged under the lock: a retention expiry of it either committed (and is seen) or waits.
    session.refresh(target)
    require_restorable(session, job, target)
    number = int(
        session.scalar(select(func.max(Branch.number)).where(Branch.job_id == job_id)) or 0
    )
    number += 1
    session.execute(
        insert(Branch).values(
            job_id=job_id,
            number=number,
            parent=current,
            from_step=step,
            from_checkpoint_id=target.id,
            created_by=actor,
            reason=reason,
        )
    )
    superseded = supersede(session, job_id, after, step, number, actor=actor)
    session.execute(update(Job).where(Job.id == job_id).values(current_branch=number))
    record(
        session,
        EventKind.ROLLED_BACK,
        checkpoint_id=target.id,
        job_id=job_id,
        actor=actor,
        detail={
            "step": step,
            "branch": number,
            "from_branch": current,
            "superseded": len(superseded),
            "reason": reason,
        },
    )
    made = _branch(session, job_id, number)
    return RollbackResult(job, True, _view(made, number), superseded)


def _saved_since(session: Session, job_id: int, branch: int, step: int) -> bool:
    """Whether `branch` holds a checkpoint after `step` (one probe of the (job, branch, step)
    unique index)."""
    return bool(
        session.scalar(
            select(
                exists().where(
                    Checkpoint.job_id == job_id,
                    Checkpoint.branch == branch,
                    Checkpoint.step > step,
                )
            )
        )
    )


def _winner(head: Branch, current: int) -> dict[str, object]:
    v = _view(head, current)
    return {
        "number": v.number,
        "parent": v.parent,
        "from_step": v.from_step,
        "from_checkpoint_id": v.from_checkpoint_id,
        "created_at": v.created_at.isoformat(),
        "created_by": v.created_by,
        "reason": v.reason,
        "current": v.current,
        "step_dir": v.step_dir,
    }
