"""Health verdicts on a real catalog: each move of the table is recorded with its evidence and an
event, the same verdict again changes nothing, `bad` quarantines the checkpoint as evidence in
the same transaction and is final."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Checkpoint, Event
from tierpoint.catalog.timeline.verdicts import give_verdict, quarantine_reason
from tierpoint.errors import CheckpointNotFound, JobNotFound, VerdictConflict


def _verdicts(session: Session, checkpoint_id: int) -> list[tuple[str | None, str]]:
    rows = session.scalars(
        select(Event.detail)
        .where(Event.checkpoint_id == checkpoint_id, Event.kind == EventKind.VERDICT.value)
        .order_by(Event.id)
    )
    return [(d["previous"], d["verdict"]) for d in rows]


def test_verdicts_move_by_the_table_and_bad_is_final(session: Session) -> None:
    job = job_row(session)
    cp = checkpoint_row(session, job.id, 7)
    assert give_verdict(session, job.name, 7, "good", metric="loss", value=1.5, actor="trainer")
    assert not give_verdict(session, job.name, 7, "good", metric="loss", value=9.0, actor="x")
    row = session.execute(
        select(Checkpoint.health, Checkpoint.health_by, Checkpoint.health_evidence).where(
            Checkpoint.id == cp
        )
    ).one()
    assert (row.health, row.health_by) == ("good", "trainer")
    # The first evidence stands when the same verdict comes again.
    assert row.health_evidence == {"metric": "loss", "value": 1.5, "at_step": None, "detail": None}
    assert give_verdict(session, job.name, 7, "suspect", actor="trainer")

    assert give_verdict(
        session, job.name, 7, "bad", metric="loss", value=math.nan, at_step=9, actor="trainer"
    )
    bad = session.get_one(Checkpoint, cp)
    assert bad.health == "bad"
    assert bad.health_evidence is not None and bad.health_evidence["value"] == "NaN"
    assert bad.quarantine_reason == "verdict bad: loss=NaN at step 9"
    assert bad.quarantine_evidence
    for again in ("good", "suspect"):
        with pytest.raises(VerdictConflict, match="bad is final") as refused:
            give_verdict(session, job.name, 7, again, actor="trainer")
        assert refused.value.extra == {"verdict": "bad"}
    assert _verdicts(session, cp) == [(None, "good"), ("good", "suspect"), ("suspect", "bad")]


def test_a_verdict_on_a_step_or_job_that_does_not_exist_is_refused(session: Session) -> None:
    job = job_row(session)
    checkpoint_row(session, job.id, 1)
    with pytest.raises(CheckpointNotFound):
        give_verdict(session, job.name, 2, "good", actor="trainer")
    with pytest.raises(JobNotFound):
        give_verdict(session, f"{job.name}-none", 1, "good", actor="trainer")


def test_the_quarantine_reason_says_what_the_evidence_says() -> None:
    assert quarantine_reason({}) == "verdict bad"
    evidence = {"metric": "grad_norm", "value": "Infinity", "at_step": 3, "detail": "spike"}
    assert quarantine_reason(evidence) == "verdict bad: grad_norm=Infinity at step 3 (spike)"
    assert len(quarantine_reason({"detail": "x" * 2000})) == 1024


def test_a_verdict_reads_the_locked_row_not_the_sessions_copy(session: Session) -> None:
    job = job_row(session)
    cp = checkpoint_row(session, job.id, 3)
    held = session.get_one(Checkpoint, cp)  # the session now holds a copy of the row
    assert held.health is None
    # Another writer's verdict, which the session's copy of the row does not see.
    stale = update(Checkpoint).where(Checkpoint.id == cp).values(health="bad")
    session.execute(stale.execution_options(synchronize_session=False))
    with pytest.raises(VerdictConflict, match="bad is final"):
        give_verdict(session, job.name, 3, "good", actor="trainer")
    assert held.health == "bad"
