"""Lineage: every checkpoint's parent (the one its run had loaded, across branches and jobs), a
checkpoint's ancestry and descendants, and forks (a job started from another job's checkpoint).

The parent links are written once, by registration (`checkpoint/placement_on_timeline.py`), and
always point at a checkpoint registered before: the graph has no cycle. The walks still carry a
depth bound and Postgres' cycle check, so a catalog edited by hand cannot make them loop."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, literal, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint.registration import ensure_job
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint, job_id_by_name
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.catalog.timeline.branches import require_restorable
from tierpoint.errors import JobExists, LineageCycle

# Deeper than any run's history of saves; a bound, not a limit anyone meets.
MAX_DEPTH = 1_000_000


@dataclass(frozen=True)
class LineageNode:
    id: int
    job: str
    step: int
    branch: int
    superseded: bool
    health: str | None
    created_at: datetime
    parent_id: int | None
    provenance: dict[str, Any] | None


@dataclass(frozen=True)
class LineageView:
    checkpoint: LineageNode
    ancestors: list[LineageNode]
    descendants: list[LineageNode]
    truncated: bool


def _nodes(session: Session, ids: list[int]) -> dict[int, LineageNode]:
    if not ids:
        return {}
    rows = session.execute(
        select(
            Checkpoint.id,
            Job.name,
            Checkpoint.step,
            Checkpoint.branch,
            Checkpoint.superseded_by.is_not(None),
            Checkpoint.health,
            Checkpoint.created_at,
            Checkpoint.parent_id,
            Checkpoint.provenance,
        )
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id.in_(ids))
    )
    return {r[0]: LineageNode(*r) for r in rows}


def _ancestor_ids(session: Session, checkpoint_id: int) -> list[int]:
    up = (
        select(Checkpoint.parent_id.label("id"), literal(1).label("depth"))
        .where(Checkpoint.id == checkpoint_id, Checkpoint.parent_id.is_not(None))
        .cte("up", recursive=True)
    )
    up = up.union(
        select(Checkpoint.parent_id, up.c.depth + 1)
        .join(up, Checkpoint.id == up.c.id)
        .where(Checkpoint.parent_id.is_not(None), up.c.depth < MAX_DEPTH)
    )
    return [r.id for r in session.execute(select(up.c.id, up.c.depth).order_by(up.c.depth))]


def _descendant_ids(session: Session, checkpoint_id: int, limit: int) -> list[int]:
    down = (
        select(Checkpoint.id.label("id"), literal(1).label("depth"))
        .where(Checkpoint.parent_id == checkpoint_id)
        .cte("down", recursive=True)
    )
    down = down.union(
        select(Checkpoint.id, down.c.depth + 1)
        .join(down, Checkpoint.parent_id == down.c.id)
        .where(down.c.depth < MAX_DEPTH)
    )
    q = select(down.c.id).group_by(down.c.id).order_by(func.min(down.c.depth), down.c.id)
    return list(session.scalars(q.limit(limit + 1)))


def lineage(
    session: Session, job: str, step: int, *, branch: int | None = None, limit: int = 1000
) -> LineageView:
    """The checkpoint's ancestry (parent first, up to its root) and its descendants (breadth
    first, at most `limit`)."""
    key = find_checkpoint(session, job, step, branch=branch)
    up = _ancestor_ids(session, key.id)
    down = _descendant_ids(session, key.id, limit)
    nodes = _nodes(session, [key.id, *up, *down[:limit]])
    return LineageView(
        nodes[key.id],
        [nodes[i] for i in up if i in nodes],
        [nodes[i] for i in down[:limit] if i in nodes],
        len(down) > limit,
    )


@dataclass(frozen=True)
class ForkResult:
    job: str
    created: bool
    parent_id: int
    created_at: datetime
    created_by: str | None


def _descends_from(session: Session, job_id: int, ancestor_job_id: int) -> bool:
    """Whether job `job_id` was forked, directly or through other forks, from job
    `ancestor_job_id` (or is it)."""
    seen: set[int] = set()
    current: int | None = job_id
    while current is not None and current not in seen:
        if current == ancestor_job_id:
            return True
        seen.add(current)
        current = session.scalar(
            select(Checkpoint.job_id)
            .join(Job, Job.fork_parent_id == Checkpoint.id)
            .where(Job.id == current)
        )
    return False


def fork(
    session: Session,
    job: str,
    parent_job: str,
    parent_step: int,
    *,
    parent_branch: int | None,
    actor: str | None,
) -> ForkResult:
    """Start job `job` from a checkpoint of another job (docs/api.md, "Forks")."""
    parent = find_checkpoint(session, parent_job, parent_step, lock=True, branch=parent_branch)
    require_restorable(session, parent_job, session.get_one(Checkpoint, parent.id))
    existing = job_id_by_name(session, job)
    # guard: fork-cycle
    if existing is not None and _descends_from(session, parent.job_id, existing):
        raise LineageCycle(
            f"job {job!r} cannot start from {parent_job}/{parent_step}: {parent_job!r} is "
            f"{'the same job' if existing == parent.job_id else 'one of its descendants'}",
        )
    job_id = ensure_job(session, job)
    row = session.execute(
        select(Job.fork_parent_id, Job.forked_at, Job.forked_by)
        .where(Job.id == job_id)
        .with_for_update()
    ).one()
    if row.fork_parent_id == parent.id:
        assert row.forked_at is not None
        return ForkResult(job, False, parent.id, row.forked_at, row.forked_by)
    has_checkpoints = session.scalar(select(exists().where(Checkpoint.job_id == job_id)))
    if row.fork_parent_id is not None or has_checkpoints:
        raise JobExists(
            f"job {job!r} exists already (it has checkpoints or another fork parent): fork "
            "into a new job name",
        )
    forked_at = session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(fork_parent_id=parent.id, forked_at=func.now(), forked_by=actor)
        .returning(Job.forked_at)
    ).scalar_one()
    record(
        session,
        EventKind.FORKED,
        checkpoint_id=parent.id,
        job_id=parent.job_id,
        actor=actor,
        detail={"step": parent_step, "child": job},
    )
    assert forked_at is not None
    return ForkResult(job, True, parent.id, forked_at, actor)
