"""A rollback's supersede on a real catalog: the checkpoints of the timeline after the step it
rolls back to are locked with their tier copies, marked superseded by the new branch (the
checkpoint and each of its tier copies, which "latest" reads), each with an event; a checkpoint
already superseded is left as it is."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import lock_for_rollback, supersede
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Checkpoint, Event, TierCopy


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
