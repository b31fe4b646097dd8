"""Pins on a real catalog: a pin or an unpin is recorded once however often it is asked for, and
a pin is refused, changing nothing, while retention is deleting one of the checkpoint's copies."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.holds.pins import set_pinned
from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.errors import CheckpointNotFound, CopyExpiring, JobNotFound
from tierpoint.states import TierState


def _checkpoint(session: Session) -> tuple[int, str]:
    """(checkpoint id, job name) of a one-shard checkpoint at step 1."""
    cp, _shard = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return cp, job


def _events(session: Session, cp: int) -> list[str]:
    kinds = session.scalars(select(Event.kind).where(Event.checkpoint_id == cp).order_by(Event.id))
    return list(kinds)


def test_a_pin_and_an_unpin_are_recorded_once_however_often_asked(session: Session) -> None:
    cp, job = _checkpoint(session)
    first = set_pinned(session, job, 1, True, "ops")
    again = set_pinned(session, job, 1, True, "ops")
    assert (first.pinned, first.changed) == (True, True)
    assert (again.pinned, again.changed) == (True, False)
    assert session.scalar(select(Checkpoint.pinned).where(Checkpoint.id == cp)) is True
    set_pinned(session, job, 1, False, "ops")
    assert not set_pinned(session, job, 1, False, "ops").changed
    assert session.scalar(select(Checkpoint.pinned).where(Checkpoint.id == cp)) is False
    assert _events(session, cp) == ["pinned", "unpinned"]


def test_a_pin_during_an_expiry_is_refused_naming_the_tiers_and_changes_nothing(
    session: Session,
) -> None:
    cp, job = _checkpoint(session)
    # Retention has flipped the copy to expiring: its delete is under way.
    for state in (TierState.RESTORABLE, TierState.EXPIRING):
        session.execute(
            update(TierCopy)
            .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
            .values(state=state.value)
        )
    with pytest.raises(CopyExpiring, match="being expired on ssd") as refused:
        set_pinned(session, job, 1, True, "ops")
    assert refused.value.extra == {"tiers": ["ssd"]}
    assert session.scalar(select(Checkpoint.pinned).where(Checkpoint.id == cp)) is False
    assert _events(session, cp) == []
    # An unpin is never refused: it keeps nothing.
    assert not set_pinned(session, job, 1, False, "ops").changed


def test_an_unknown_job_or_step_is_not_found(session: Session) -> None:
    cp, job = _checkpoint(session)
    with pytest.raises(JobNotFound):
        set_pinned(session, f"no-such-job-{uuid.uuid4().hex[:6]}", 1, True, "ops")
    with pytest.raises(CheckpointNotFound):
        set_pinned(session, job, 2, True, "ops")
    assert _events(session, cp) == []
