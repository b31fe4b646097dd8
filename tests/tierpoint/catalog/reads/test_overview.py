"""The jobs overview on a real catalog: a page of jobs by name with its cursor and filters, each
job's head (its timeline's newest step, not a deleted or superseded one), its recovery point on
every tier (the newest restorable copy, never a quarantined or superseded one) and how far behind
the head it is, the bytes it holds there, and its open copies."""

from __future__ import annotations

import uuid

from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import supersede
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.catalog.reads.overview import count_jobs, jobs_overview

TIERS = ("ssd", "s3")


def _named(session: Session, name: str) -> Job:
    job = job_row(session)
    job.name = name
    session.flush()
    return job


def _tier_copy(session: Session, cp: int, tier: str, **values: object) -> None:
    session.execute(
        update(TierCopy).where(TierCopy.checkpoint_id == cp, TierCopy.tier == tier).values(**values)
    )


def _checkpoint(
    session: Session, job_id: int, step: int, restorable_on: tuple[str, ...], branch: int = 1
) -> int:
    """A checkpoint of 100 bytes with a copy on both tiers, restorable on `restorable_on`."""
    cp = checkpoint_row(session, job_id, step, tiers=TIERS, branch=branch)
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(total_bytes=100))
    for tier in restorable_on:
        _tier_copy(session, cp, tier, state="restorable")
    return cp


def test_jobs_are_paged_by_name_and_filtered_by_prefix_or_name(session: Session) -> None:
    p = f"ov{uuid.uuid4().hex[:8]}"
    for name in (f"{p}-c", f"{p}-a", f"{p}-b", f"{p}xa"):
        _named(session, name)

    first, cursor, _ = jobs_overview(session, TIERS, limit=2, prefix=f"{p}-")
    assert ([v.job for v in first], cursor) == ([f"{p}-a", f"{p}-b"], f"{p}-b")
    rest, cursor, _ = jobs_overview(session, TIERS, limit=2, prefix=f"{p}-", after_name=cursor)
    assert ([v.job for v in rest], cursor) == ([f"{p}-c"], None)
    assert count_jobs(session, prefix=f"{p}-") == 3
    # A prefix is matched literally: "_" is a name's character here, not LIKE's any-character.
    assert jobs_overview(session, TIERS, prefix=f"{p}_")[0] == []
    assert count_jobs(session, prefix=f"{p}_") == 0
    one, cursor, _ = jobs_overview(session, TIERS, job=f"{p}xa")
    assert ([v.job for v in one], cursor) == ([f"{p}xa"], None)
    assert count_jobs(session, job=f"{p}xa") == 1


def test_each_tiers_recovery_point_is_its_newest_restorable_copy_and_how_far_behind(
    session: Session,
) -> None:
    job = job_row(session)
    _checkpoint(session, job.id, 10, ("ssd", "s3"))
    _checkpoint(session, job.id, 20, ("ssd",))
    _checkpoint(session, job.id, 30, ())

    [view], _, _ = jobs_overview(session, TIERS, job=job.name)
    assert (view.latest_step, view.checkpoints) == (30, 3)
    points = {t.tier: t for t in view.tiers}
    assert [(t.tier, t.latest_step, t.steps_behind) for t in view.tiers] == [
        ("ssd", 20, 10),
        ("s3", 10, 20),
    ]
    # At risk: the steps since the newest point on any tier, and on the last (durable) tier.
    assert (view.steps_at_risk, view.steps_at_risk_durable) == (10, 20)
    # Held bytes are the catalog's running totals of restorable copies.
    assert (points["ssd"].bytes, points["ssd"].checkpoints) == (200, 2)
    assert (points["s3"].bytes, points["s3"].checkpoints) == (100, 1)
    assert points["ssd"].age_seconds is not None and points["ssd"].age_seconds >= 0


def test_a_quarantined_copy_or_checkpoint_is_no_recovery_point(session: Session) -> None:
    job = job_row(session)
    _checkpoint(session, job.id, 10, ("ssd", "s3"))
    bad_copy = _checkpoint(session, job.id, 20, ("ssd", "s3"))
    _tier_copy(session, bad_copy, "s3", quarantine_reason="crc mismatch")
    bad = _checkpoint(session, job.id, 30, ("ssd", "s3"))
    session.execute(update(Checkpoint).where(Checkpoint.id == bad).values(quarantine_reason="NaN"))

    [view], _, _ = jobs_overview(session, TIERS, job=job.name)
    assert [(t.tier, t.latest_step) for t in view.tiers] == [("ssd", 20), ("s3", 10)]


def test_after_a_rollback_the_head_and_points_skip_superseded_and_deleted_checkpoints(
    session: Session,
) -> None:
    job = job_row(session)
    _checkpoint(session, job.id, 10, ("ssd", "s3"))
    old = [_checkpoint(session, job.id, s, ("ssd", "s3")) for s in (20, 30)]
    supersede(session, job.id, old, 10, 2, actor=None)
    _checkpoint(session, job.id, 20, ("ssd",), branch=2)
    deleted = _checkpoint(session, job.id, 40, ())
    session.execute(
        update(Checkpoint).where(Checkpoint.id == deleted).values(deleted_at=Checkpoint.created_at)
    )

    [view], _, _ = jobs_overview(session, TIERS, job=job.name)
    # The head is the new branch's step 20, not the superseded 30 nor the deleted 40; superseded
    # checkpoints still count (listed, held), a deleted one does not.
    assert (view.latest_step, view.checkpoints) == (20, 4)
    assert [(t.tier, t.latest_step, t.steps_behind) for t in view.tiers] == [
        ("ssd", 20, 0),
        ("s3", 10, 10),
    ]


def test_open_copies_count_pending_and_unacknowledged_failures_per_checkpoint(
    session: Session,
) -> None:
    job = job_row(session)
    _checkpoint(session, job.id, 1, ())  # pending on both tiers: one checkpoint in flight
    failed = _checkpoint(session, job.id, 2, ("ssd",))
    _tier_copy(session, failed, "s3", state="failed", reason="quota")
    seen = _checkpoint(session, job.id, 3, ("ssd",))
    _tier_copy(session, seen, "s3", state="failed", reason="quota")
    _tier_copy(session, seen, "s3", acknowledged_at=TierCopy.updated_at)

    [view], _, _ = jobs_overview(session, TIERS, job=job.name)
    assert (view.in_flight, view.failed) == (1, 1)
    # Nothing restorable anywhere: every step is at risk, said as None.
    empty = job_row(session)
    _checkpoint(session, empty.id, 5, ())
    [none], _, _ = jobs_overview(session, TIERS, job=empty.name)
    assert (none.steps_at_risk, none.steps_at_risk_durable) == (None, None)
    assert [(t.latest_step, t.bytes) for t in none.tiers] == [(None, 0), (None, 0)]
