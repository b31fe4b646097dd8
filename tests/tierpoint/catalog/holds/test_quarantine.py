"""Quarantine on a real catalog: a job's hides, an operator's is evidence a job's report cannot
turn back into a hide; the same verdict twice changes and records nothing; a tier's copy that
retention is deleting cannot be quarantined, and nothing changes."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.holds.quarantine import set_quarantine
from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.errors import CopyExpiring, TierCopyNotFound
from tierpoint.states import TierState


def _checkpoint(session: Session) -> tuple[int, str]:
    cp, _shard = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return cp, job


def _verdict(session: Session, cp: int) -> tuple[str | None, bool]:
    row = session.execute(
        select(Checkpoint.quarantine_reason, Checkpoint.quarantine_evidence).where(
            Checkpoint.id == cp
        )
    ).one()
    return row[0], row[1]


def _events(session: Session, cp: int) -> list[str]:
    return list(
        session.scalars(select(Event.kind).where(Event.checkpoint_id == cp).order_by(Event.id))
    )


def test_an_operators_evidence_outranks_a_jobs_hide_and_repeats_change_nothing(
    session: Session,
) -> None:
    cp, job = _checkpoint(session)
    assert set_quarantine(session, job, 1, "loss NaN", tier=None, actor="train")
    assert not set_quarantine(session, job, 1, "loss NaN", tier=None, actor="train")
    assert _verdict(session, cp) == ("loss NaN", False)
    assert set_quarantine(session, job, 1, "bad load", tier=None, actor="ops", evidence=True)
    # The job reports again: the operator's evidence stays as it is.
    assert not set_quarantine(session, job, 1, "loss NaN again", tier=None, actor="train")
    assert _verdict(session, cp) == ("bad load", True)
    assert set_quarantine(session, job, 1, None, tier=None, actor="ops")
    assert _verdict(session, cp) == (None, False)
    assert _events(session, cp) == ["quarantined", "quarantined", "quarantine_lifted"]


def test_a_copy_being_expired_cannot_be_quarantined_and_nothing_changes(session: Session) -> None:
    cp, job = _checkpoint(session)
    assert set_quarantine(session, job, 1, "rotten", tier="ssd", actor="ops", evidence=True)
    set_quarantine(session, job, 1, None, tier="ssd", actor="ops")
    for state in (TierState.RESTORABLE, TierState.EXPIRING):
        session.execute(
            update(TierCopy).where(TierCopy.checkpoint_id == cp).values(state=state.value)
        )
    with pytest.raises(CopyExpiring) as refused:
        set_quarantine(session, job, 1, "rotten", tier="ssd", actor="ops", evidence=True)
    assert refused.value.extra == {"state": "expiring"}
    reason = session.scalar(select(TierCopy.quarantine_reason).where(TierCopy.checkpoint_id == cp))
    assert reason is None
    assert _events(session, cp) == ["quarantined", "quarantine_lifted"]
    with pytest.raises(TierCopyNotFound):
        set_quarantine(session, job, 1, "rotten", tier="lustre", actor="ops")
