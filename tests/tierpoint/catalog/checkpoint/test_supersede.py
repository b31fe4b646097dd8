"""A rollback's supersede on a real migrated catalog: the checkpoints of the timeline after the
step it rolls back to are locked with their tier copies, marked superseded by the new branch (the
checkpoint and each of its tier copies, which "latest" reads), each with one event; a checkpoint
already superseded is left as it is; and however many it supersedes, a rollback runs the same
statements (a rollback over a long run's tail must not grow with it)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import event, insert, select
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import lock_for_rollback, supersede
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.catalog.timeline.branches import rollback


def test_a_rollback_supersedes_the_timeline_after_its_step(session: Session) -> None:
    job = job_row(session)
    one, two, three = (
        checkpoint_row(session, job.id, step, tiers=("ssd", "s3")) for step in (1, 2, 3)
    )
    after = lock_for_rollback(session, job.id, 1, one)
    assert sorted(after) == [two, three]

    assert supersede(session, job.id, after, 1, 2, actor="operator") == [2, 3]
    superseded = {
        r.id: r.superseded_by
        for r in session.execute(
            select(Checkpoint.id, Checkpoint.superseded_by).where(Checkpoint.job_id == job.id)
        )
    }
    assert superseded == {one: None, two: 2, three: 2}
    copies = session.execute(
        select(TierCopy.checkpoint_id, TierCopy.superseded).where(TierCopy.job_id == job.id)
    ).all()
    assert sorted(copies) == sorted(
        [(one, False), (one, False), (two, True), (two, True), (three, True), (three, True)]
    )
    events = session.execute(
        select(Event.checkpoint_id, Event.actor, Event.detail).where(
            Event.job_id == job.id, Event.kind == EventKind.SUPERSEDED.value
        )
    ).all()
    assert sorted((e.checkpoint_id, e.actor, e.detail["by_branch"]) for e in events) == [
        (two, "operator", 2),
        (three, "operator", 2),
    ]
    assert all(e.detail["rollback_to"] == 1 for e in events)

    # A second rollback over the same checkpoints supersedes nothing again, and says so.
    assert lock_for_rollback(session, job.id, 1, one) == []
    assert supersede(session, job.id, [two, three], 1, 3, actor="operator") == []
    assert supersede(session, job.id, [], 1, 3, actor="operator") == []
    assert session.get_one(Checkpoint, two).superseded_by == 2


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
