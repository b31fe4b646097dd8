"""An admin's deletion on a real catalog: a pinned, leased or in-flight checkpoint is refused
without force and nothing changes; a deletion sends every copy to expiry, marks the checkpoint
deleted and records it once; deleting it again does nothing more."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.checkpoint.deletion import delete_checkpoints
from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.errors import CheckpointProtected
from tierpoint.states import TierState


def _checkpoint(session: Session) -> tuple[int, str]:
    cp, _shard = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return cp, job


def _state(session: Session, cp: int) -> tuple[bool, bool, str, list[str]]:
    """(deleted, pinned, its ssd copy's state, its events)."""
    deleted_at, pinned = session.execute(
        select(Checkpoint.deleted_at, Checkpoint.pinned).where(Checkpoint.id == cp)
    ).one()
    copy = session.scalar(select(TierCopy.state).where(TierCopy.checkpoint_id == cp))
    events = session.scalars(select(Event.kind).where(Event.checkpoint_id == cp))
    assert copy is not None
    return deleted_at is not None, pinned, copy, list(events)


def test_a_protected_checkpoint_is_refused_without_force_and_nothing_changes(
    session: Session,
) -> None:
    cp, job = _checkpoint(session)
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(pinned=True))
    with pytest.raises(CheckpointProtected) as refused:
        delete_checkpoints(session, job, 1, "admin", force=False)
    assert refused.value.extra == {"protected": {"1": ["pinned", "in flight"]}}
    assert _state(session, cp) == (False, True, "pending", [])
    forced = delete_checkpoints(session, job, 1, "admin", force=True)
    (gone,) = forced.deleted
    assert (gone.step, gone.tiers, gone.overrode) == (1, ["ssd"], ["pinned", "in flight"])
    assert _state(session, cp) == (True, False, "expiring", ["deleted"])
    again = delete_checkpoints(session, job, None, "admin", force=False)
    assert (again.deleted, again.already_deleted) == ([], [1])
    assert _state(session, cp)[3] == ["deleted"]


def test_an_unprotected_checkpoint_goes_to_expiry_without_force(session: Session) -> None:
    cp, job = _checkpoint(session)
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp)
        .values(state=TierState.RESTORABLE.value)
    )
    (gone,) = delete_checkpoints(session, job, 1, "admin", force=False).deleted
    assert (gone.tiers, gone.overrode) == (["ssd"], [])
    assert _state(session, cp) == (True, False, "expiring", ["deleted"])
