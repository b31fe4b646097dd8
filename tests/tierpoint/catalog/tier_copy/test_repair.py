"""Repair's plan on a real catalog: only tiers it may touch (never pending, expiring or expired
copies, nor copies retention would not keep), only shards with a verified source, and a hold on
the tiers it reads until the repaired tier is promoted."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.catalog_rows import (
    SEEDED_TIERS,
    replica_ids,
    verified_everywhere,
)
from tests.helpers.lifecycle import new_job
from tests.helpers.retention import create_job
from tierpoint.catalog.models import (
    Checkpoint,
    Job,
    TierCopy,
)
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.repair import plan_repair
from tierpoint.config import Settings
from tierpoint.retention.policy import TierRef
from tierpoint.states import ReplicaState


def test_repair_plans_only_tiers_it_may_touch_and_shards_with_a_source(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    now = datetime.now(UTC)
    tiers = settings.tiers
    seeded = verified_everywhere(settings, sessions, new_job(), 2)
    cp = seeded.checkpoint_id
    s3 = replica_ids(sessions, cp, "s3")
    with sessions.begin() as s:
        mark_damaged(s, {s3[0]: "x", s3[3]: "y"}, ReplicaState.LOST, "t")
        plan = plan_repair(s, cp, tiers, now, batch_size=500, limit=100)
    assert plan.left == []
    (tier,) = plan.tiers
    assert tier.tier == "s3"
    # Shard 0 is on node-a, shard 3 on node-b: one batch per node, on the node (ssd is fastest).
    assert sorted((b.batch.node, b.batch.first, b.batch.last, b.on_node) for b in tier.batches) == [
        ("node-a", 0, 0, True),
        ("node-b", 3, 3, True),
    ]

    # Without a verified copy elsewhere: left, named.
    ssd, lustre = replica_ids(sessions, cp, "ssd"), replica_ids(sessions, cp, "lustre")
    with sessions.begin() as s:
        mark_damaged(s, {ssd[0]: "x", lustre[0]: "x"}, ReplicaState.CORRUPT, "t")
        plan = plan_repair(s, cp, tiers, now, batch_size=500, limit=100)
    assert "s3: no verified source of 1 shard(s)" in plan.left
    by_tier = {t.tier: [(b.batch.node, b.batch.first) for b in t.batches] for t in plan.tiers}
    assert by_tier == {"s3": [("node-b", 3)]}

    # Pending (the lifecycle's), expiring and expired copies are never repaired.
    for state, left in [("pending", "s3: still being copied by the lifecycle"), ("expiring", None)]:
        with sessions.begin() as s:
            s.execute(
                update(TierCopy)
                .where(TierCopy.checkpoint_id == cp, TierCopy.tier.in_(SEEDED_TIERS))
                .values(state=state)
            )
            plan = plan_repair(s, cp, tiers, now, batch_size=500, limit=100)
        assert plan.tiers == []
        if left:
            assert left in plan.left


def test_repair_leaves_copies_retention_would_not_keep(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job = new_job()
    create_job(sessions, job, {"tiers": {"s3": {"keep_last": 1}}})
    old = verified_everywhere(settings, sessions, job, 3)
    new = verified_everywhere(settings, sessions, job, 4)
    now = datetime.now(UTC)
    # The newer step is good on s3: keep_last=1 would expire a repaired older copy at once.
    ids = replica_ids(sessions, old.checkpoint_id, "s3")
    with sessions.begin() as s:
        mark_damaged(s, {ids[0]: "gone"}, ReplicaState.LOST, "t")
        old_plan = plan_repair(s, old.checkpoint_id, settings.tiers, now, 500, 100)
    assert old_plan.tiers == [] and old_plan.left == ["s3: retention would not keep a copy here"]
    # The newest one is what keep_last keeps: repaired.
    ids = replica_ids(sessions, new.checkpoint_id, "s3")
    with sessions.begin() as s:
        mark_damaged(s, {ids[0]: "gone"}, ReplicaState.LOST, "t")
        new_plan = plan_repair(s, new.checkpoint_id, settings.tiers, now, 500, 100)
    assert [t.tier for t in new_plan.tiers] == ["s3"]


def test_repair_holds_the_tiers_it_reads_against_retention_until_promoted(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    """Repair reads each shard from the fastest other tier holding it verified, faster or slower:
    lustre's shard 0 from ssd and shard 1 from S3 (its ssd copy is bad too), ssd's shard 1 from
    S3. The plan records that on each repaired marker (what retention keeps as
    `rebuild_source`); each tier's promotion, made or given up, releases its own."""
    cp = verified_everywhere(settings, sessions, new_job(), 1).checkpoint_id
    ssd, lustre = replica_ids(sessions, cp, "ssd"), replica_ids(sessions, cp, "lustre")
    now = datetime.now(UTC)
    refs = [TierRef(t.name, t.kind) for t in settings.tiers]
    with sessions.begin() as s:
        mark_damaged(s, {lustre[0]: "x", lustre[1]: "y", ssd[1]: "y"}, ReplicaState.CORRUPT, "t")
        plan = plan_repair(s, cp, settings.tiers, now, batch_size=500, limit=100)
    assert [t.tier for t in plan.tiers] == ["ssd", "lustre"]
    assert _holds(sessions, cp) == {"ssd": ["s3"], "lustre": ["s3", "ssd"], "s3": None}
    with sessions.begin() as s:
        snap = take_snapshot(s, _job_of(s, cp), refs, now)
    (copies,) = [c.copies for c in snap.checkpoints if c.id == cp]
    assert copies["lustre"].rebuild_from == {"s3", "ssd"}

    with sessions.begin() as s:
        promote(s, cp, "lustre", [], "1 of 1 batches failed")
    assert _holds(sessions, cp) == {"ssd": ["s3"], "lustre": None, "s3": None}


def _holds(sessions: sessionmaker[Session], cp: int) -> dict[str, list[str] | None]:
    with sessions.begin() as s:
        rows = s.execute(
            select(TierCopy.tier, TierCopy.rebuild_from, TierCopy.rebuild_until).where(
                TierCopy.checkpoint_id == cp
            )
        ).all()
    assert all((held is None) == (until is None) for _, held, until in rows)
    return {tier: held for tier, held, _ in rows}


def _job_of(s: Session, cp: int) -> str:
    name = s.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert name is not None
    return name
