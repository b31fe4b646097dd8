"""A rollback's writes on a real migrated catalog: however many checkpoints it supersedes, it
runs the same statements (a rollback over a long run's tail must not grow with it), and each of
them still ends superseded by the new branch, its tier copies flagged for `latest`'s index, and
one `superseded` event each."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import event, insert, select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.catalog.timeline.branches import rollback


def _job_of(session: Session, steps: int) -> str:
    """A job with checkpoints 1..`steps` on branch 1, each restorable on lustre."""
    name = f"job-{uuid.uuid4().hex[:10]}"
    job_id = session.scalar(insert(Job).values(name=name).returning(Job.id))
    ids = session.scalars(
        insert(Checkpoint).returning(Checkpoint.id),
        [
            {
                "job_id": job_id,
                "step": s,
                "total_bytes": 1,
                "shard_count": 1,
                "manifest_digest": f"d{s}",
            }
            for s in range(1, steps + 1)
        ],
    ).all()
    session.execute(
        insert(TierCopy),
        [
            {
                "checkpoint_id": cid,
                "tier": "lustre",
                "job_id": job_id,
                "step": s,
                "state": "restorable",
            }
            for s, cid in enumerate(ids, start=1)
        ],
    )
    return name


def _statements_of_rollback(session: Session, job: str) -> tuple[int, list[int]]:
    """(statements the server ran, steps superseded) for a rollback of `job` to step 1; an
    executemany counts once per row, as the server runs it."""
    ran: list[int] = []

    def count(_c: Any, _cur: Any, _stmt: str, params: Any, _ctx: Any, many: bool) -> None:
        ran.append(len(params) if many else 1)

    engine = session.connection().engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        result = rollback(session, job, 1, from_branch=None, reason="test", actor="t")
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return sum(ran), result.superseded


def test_a_rollback_runs_the_same_statements_however_many_checkpoints_it_supersedes(
    session: Session,
) -> None:
    short, long = _job_of(session, 3), _job_of(session, 60)
    few, superseded_few = _statements_of_rollback(session, short)
    many, superseded_many = _statements_of_rollback(session, long)
    assert superseded_few == [2, 3]
    assert superseded_many == list(range(2, 61))
    assert many == few, f"{few} statements for 2 superseded checkpoints, {many} for 59"

    job_id = session.scalar(select(Job.id).where(Job.name == long))
    rows = session.execute(
        select(Checkpoint.step, Checkpoint.superseded_by)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.step)
    ).all()
    assert rows == [(1, None)] + [(s, 2) for s in range(2, 61)]
    flagged = session.execute(
        select(TierCopy.step, TierCopy.superseded)
        .where(TierCopy.job_id == job_id)
        .order_by(TierCopy.step)
    ).all()
    assert flagged == [(1, False)] + [(s, True) for s in range(2, 61)]
    events = session.execute(
        select(Checkpoint.step, Event.actor, Event.detail)
        .join(Checkpoint, Checkpoint.id == Event.checkpoint_id)
        .where(Event.job_id == job_id, Event.kind == "superseded")
        .order_by(Checkpoint.step)
    ).all()
    assert events == [(s, "t", {"step": s, "by_branch": 2, "rollback_to": 1}) for s in range(2, 61)]
