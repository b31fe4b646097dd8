"""Restore leases on a real catalog: only a checkpoint restorable from some tier can be leased; a
lease runs for its time on the database's clock, renews while active, is released once, and a
released or lapsed lease is never revived."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tests.helpers.planner_builders import TIERS
from tierpoint.catalog.holds.leases import (
    create_lease,
    list_leases,
    release_lease,
    renew_lease,
    restorable_tiers,
)
from tierpoint.catalog.models import Checkpoint, Job, RestoreLease, TierCopy
from tierpoint.catalog.policy.snapshot import take_snapshot
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


def _scans_of(plan: dict[str, Any], table: str) -> Iterator[dict[str, Any]]:
    if plan.get("Relation Name") == table:
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans_of(child, table)


def test_retentions_lease_check_reads_no_released_lease(session: Session) -> None:
    """A restart storm leaves thousands of released leases on one checkpoint until they would
    have expired; retention's check for an active lease (the statement its snapshot sends, run
    under EXPLAIN ANALYZE) reads the active ones only, through the index of active leases."""
    cp, job = _checkpoint(session)
    _restorable(session, cp)
    hour = func.now() + timedelta(hours=1)
    released = [{"checkpoint_id": cp, "expires_at": hour, "released_at": func.now()}] * 3000
    session.execute(insert(RestoreLease).values(released))
    create_lease(session, job, 1, 3600, "the one still restoring", "ops")
    session.execute(text("ANALYZE restore_lease"))
    sent: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "restore_lease" in statement:
            sent.append((statement, parameters))

    connection = session.connection()
    now = session.scalar(select(func.now()))
    assert now is not None
    event.listen(connection, "before_cursor_execute", keep)
    try:
        snapshot = take_snapshot(session, job, TIERS, now)
    finally:
        event.remove(connection, "before_cursor_execute", keep)
    assert [c.leased for c in snapshot.checkpoints] == [True]
    assert sent
    for statement, parameters in sent:
        explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + statement
        plan = connection.exec_driver_sql(explain, parameters).scalar_one()[0]["Plan"]
        scans = list(_scans_of(plan, "restore_lease"))
        assert scans, plan
        for scan in scans:
            assert scan.get("Index Name") == "ix_restore_lease_active", scan
            assert scan.get("Rows Removed by Filter", 0) == 0, scan
