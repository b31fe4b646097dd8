"""Restore leases on a real catalog: only a checkpoint restorable from some tier can be leased; a
lease runs for its time on the database's clock, renews while active, is released once, and a
released or lapsed lease is never revived."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.holds.leases import (
    create_lease,
    list_leases,
    release_lease,
    renew_lease,
    restorable_tiers,
)
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.errors import LeaseEnded, LeaseNotFound, NotLeasable
from tierpoint.states import TierState


def _checkpoint(session: Session) -> tuple[int, str]:
    cp, _shard = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return cp, job


def _restorable(session: Session, cp: int) -> None:
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp)
        .values(state=TierState.RESTORABLE.value)
    )


def test_only_a_checkpoint_restorable_from_some_tier_is_leased(session: Session) -> None:
    cp, job = _checkpoint(session)
    with pytest.raises(NotLeasable):  # its only copy is still pending
        create_lease(session, job, 1, 60, "trainer", "ops")
    _restorable(session, cp)
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(quarantine_reason="NaN"))
    assert restorable_tiers(session, cp) == []
    with pytest.raises(NotLeasable):
        create_lease(session, job, 1, 60, "trainer", "ops")
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(quarantine_reason=None))
    assert restorable_tiers(session, cp) == ["ssd"]
    lease = create_lease(session, job, 1, 60, "trainer", "ops")
    assert lease.active and lease.owner == "trainer"
    assert lease.expires_at - lease.created_at == timedelta(seconds=60)


def test_a_lease_renews_while_active_is_released_once_and_never_revived(session: Session) -> None:
    cp, job = _checkpoint(session)
    _restorable(session, cp)
    lease = create_lease(session, job, 1, 60, None, "ops")
    renewed = renew_lease(session, job, 1, lease.id, 600, "ops")
    assert renewed.expires_at - lease.created_at == timedelta(seconds=600)
    assert [v.id for v in list_leases(session, job, 1)] == [lease.id]
    released, now = release_lease(session, job, 1, lease.id, "ops")
    assert now and not released.active and released.released_at is not None
    assert release_lease(session, job, 1, lease.id, "ops")[1] is False
    with pytest.raises(LeaseEnded, match="has released"):
        renew_lease(session, job, 1, lease.id, 60, "ops")
    assert list_leases(session, job, 1) == []
    assert [v.id for v in list_leases(session, job, 1, include_ended=True)] == [lease.id]
    # A lease whose end the database clock has reached lapsed: it is not revived either.
    lapsed = create_lease(session, job, 1, 0, None, "ops")
    with pytest.raises(LeaseEnded, match="has expired"):
        renew_lease(session, job, 1, lapsed.id, 60, "ops")
    with pytest.raises(LeaseNotFound):
        renew_lease(session, job, 2, lapsed.id, 60, "ops")
