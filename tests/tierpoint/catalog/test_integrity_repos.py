"""The integrity repositories on a real catalog: marking replicas bad demotes their tier in the
same transaction and only once; repair plans only tiers it may touch (never pending, expiring or
expired copies, nor copies retention would not keep) and only shards with a verified source; the
scrub picks the replicas read longest ago first and counts each read once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import NODES, Seeded, new_job, random_shards, seed_checkpoint
from tests.helpers.retention import create_job
from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.models import (
    Checkpoint,
    Event,
    Job,
    Replica,
    ScrubStats,
    Shard,
    TierCopy,
)
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.catalog.replica import scrub
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.repair import plan_repair
from tierpoint.config import Settings
from tierpoint.retention.policy import TierRef
from tierpoint.states import ReplicaState

TIERS = ("ssd", "lustre", "s3")


def _everywhere(
    settings: Settings, sessions: sessionmaker[Session], job: str, step: int, age_days: int = 1
) -> Seeded:
    """A checkpoint whose catalog says it is verified and restorable on every tier."""
    seeded = seed_checkpoint(settings, sessions, job, step, random_shards(NODES, 2, 100))
    with sessions.begin() as s:
        shards = s.execute(
            select(Shard.id, Shard.node_id, Shard.path).where(
                Shard.checkpoint_id == seeded.checkpoint_id
            )
        ).all()
        s.execute(
            insert(Replica),
            [
                {
                    "shard_id": sid,
                    "checkpoint_id": seeded.checkpoint_id,
                    "tier": t,
                    "node_id": node if t == "ssd" else None,
                    "state": "verified",
                    "location": f"{t}:{path}",
                    "bytes_done": 100,
                    "verified_at": datetime.now(UTC) - timedelta(days=age_days),
                }
                for sid, node, path in shards
                for t in TIERS
            ],
        )
        job_id = s.scalar(select(Checkpoint.job_id).where(Checkpoint.id == seeded.checkpoint_id))
        s.execute(
            insert(TierCopy),
            [
                {
                    "checkpoint_id": seeded.checkpoint_id,
                    "tier": t,
                    "job_id": job_id,
                    "step": step,
                    "state": "restorable",
                }
                for t in TIERS
            ],
        )
    return seeded


def _replica_ids(sessions: sessionmaker[Session], cp: int, tier: str) -> list[int]:
    with sessions.begin() as s:
        return list(
            s.scalars(
                select(Replica.id)
                .join(Shard, Shard.id == Replica.shard_id)
                .where(Replica.checkpoint_id == cp, Replica.tier == tier)
                .order_by(Shard.ordinal)
            )
        )


def _markers(sessions: sessionmaker[Session], cp: int) -> dict[str, str]:
    with sessions.begin() as s:
        return dict(
            s.execute(
                select(TierCopy.tier, TierCopy.state).where(TierCopy.checkpoint_id == cp)
            ).all()
        )


def test_marking_bad_demotes_in_the_same_transaction_and_only_once(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = _everywhere(settings, sessions, new_job(), 1)
    cp = seeded.checkpoint_id
    first, second = _replica_ids(sessions, cp, "s3")[:2]
    with sessions.begin() as s:
        damage = mark_damaged(
            s, {first: "scrub: crc32c differs", second: "scrub: short"}, ReplicaState.CORRUPT, "t"
        )
        # Before commit the marker is already demoted in this transaction.
        assert (
            s.scalar(
                select(TierCopy.state).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "s3")
            )
            == "failed"
        )
    assert damage.marked == 2 and damage.demoted == {cp: ["s3"]} and damage.checkpoints == {cp}
    assert _markers(sessions, cp) == {"ssd": "restorable", "lustre": "restorable", "s3": "failed"}
    with sessions.begin() as s:
        reason = s.scalar(
            select(TierCopy.reason).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "s3")
        )
        events = s.execute(
            select(Event.kind, Event.tier, Event.detail).where(Event.checkpoint_id == cp)
        ).all()
    assert reason is not None and "2 shard(s) corrupt on s3 (found by t)" in reason
    assert seeded.shards[0].path in reason
    assert [(k, t, d["count"], d["marker_demoted"]) for k, t, d in events] == [
        ("corrupt", "s3", 2, True)
    ]

    # Again: nothing new (already corrupt), and `lost` on a corrupt replica changes nothing.
    with sessions.begin() as s:
        again = mark_damaged(s, {first: "again"}, ReplicaState.CORRUPT, "t")
        lost = mark_damaged(s, {second: "gone"}, ReplicaState.LOST, "t")
    assert again.marked == lost.marked == 0
    with sessions.begin() as s:
        assert len(s.execute(select(Event.id).where(Event.checkpoint_id == cp)).all()) == 1

    # A replica being expired is retention's: never marked.
    lustre = _replica_ids(sessions, cp, "lustre")[0]
    with sessions.begin() as s:
        s.execute(update(Replica).where(Replica.id == lustre).values(state="expiring"))
        assert mark_damaged(s, {lustre: "x"}, ReplicaState.LOST, "t").marked == 0


def test_repair_plans_only_tiers_it_may_touch_and_shards_with_a_source(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    now = datetime.now(UTC)
    tiers = settings.tiers
    seeded = _everywhere(settings, sessions, new_job(), 2)
    cp = seeded.checkpoint_id
    s3 = _replica_ids(sessions, cp, "s3")
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
    ssd, lustre = _replica_ids(sessions, cp, "ssd"), _replica_ids(sessions, cp, "lustre")
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
                .where(TierCopy.checkpoint_id == cp, TierCopy.tier.in_(TIERS))
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
    old = _everywhere(settings, sessions, job, 3)
    new = _everywhere(settings, sessions, job, 4)
    now = datetime.now(UTC)
    # The newer step is good on s3: keep_last=1 would expire a repaired older copy at once.
    ids = _replica_ids(sessions, old.checkpoint_id, "s3")
    with sessions.begin() as s:
        mark_damaged(s, {ids[0]: "gone"}, ReplicaState.LOST, "t")
        old_plan = plan_repair(s, old.checkpoint_id, settings.tiers, now, 500, 100)
    assert old_plan.tiers == [] and old_plan.left == ["s3: retention would not keep a copy here"]
    # The newest one is what keep_last keeps: repaired.
    ids = _replica_ids(sessions, new.checkpoint_id, "s3")
    with sessions.begin() as s:
        mark_damaged(s, {ids[0]: "gone"}, ReplicaState.LOST, "t")
        new_plan = plan_repair(s, new.checkpoint_id, settings.tiers, now, 500, 100)
    assert [t.tier for t in new_plan.tiers] == ["s3"]


def test_scrub_picks_oldest_reads_first_within_budget_and_counts_once(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    # Read longer ago than any other replica of this module's catalog (those: 1 day).
    older = _everywhere(settings, sessions, new_job(), 5, age_days=100)
    newer = _everywhere(settings, sessions, new_job(), 6, age_days=50)
    with sessions.begin() as s:
        now = catalog_now(s)
        stats = s.get(ScrubStats, "lustre")
        before = (stats.replicas, stats.bytes) if stats else (0, 0)
        ids, nbytes = scrub.due(s, "lustre", None, timedelta(0), now, budget=250, limit=10)
    older_ids = _replica_ids(sessions, older.checkpoint_id, "lustre")
    newer_ids = _replica_ids(sessions, newer.checkpoint_id, "lustre")
    assert ids[:2] == sorted(older_ids)[:2] and nbytes == 200, (ids, older_ids)
    with sessions.begin() as s:
        assert scrub.record_good(s, "lustre", ids, now) == 200
        assert scrub.record_good(s, "lustre", ids, now) == 0  # a retried batch
        again, _ = scrub.due(s, "lustre", None, timedelta(0), now, budget=10**9, limit=1000)
        stats = s.get(ScrubStats, "lustre")
        assert stats is not None
        assert (stats.replicas - before[0], stats.bytes - before[1]) == (2, 200)
    assert not set(ids) & set(again)
    assert set(newer_ids) <= set(again)
    # With a node: only that node's replicas of a local tier.
    with sessions.begin() as s:
        local, _ = scrub.due(s, "ssd", "node-b", timedelta(0), now, 10**9, 1000)
        nodes = set(s.scalars(select(Replica.node_id).where(Replica.id.in_(local))))
    assert nodes == {"node-b"}


def test_repair_holds_the_tiers_it_reads_against_retention_until_promoted(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    """Repair reads each shard from the fastest other tier holding it verified, faster or slower:
    lustre's shard 0 from ssd and shard 1 from S3 (its ssd copy is bad too), ssd's shard 1 from
    S3. The plan records that on each repaired marker (what retention keeps as
    `rebuild_source`); each tier's promotion, made or given up, releases its own."""
    cp = _everywhere(settings, sessions, new_job(), 1).checkpoint_id
    ssd, lustre = _replica_ids(sessions, cp, "ssd"), _replica_ids(sessions, cp, "lustre")
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
