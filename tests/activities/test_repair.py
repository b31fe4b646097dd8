"""The repair activities one by one (real catalog, real tiers): a tier copy found bad is copied
again through the lifecycle's own copy + verify, by the worker that can read the fastest verified
source, and left alone once retention has taken it over."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.repair import RepairActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint, shard_file
from tierpoint.catalog.models import Event, Shard, TierCopy
from tierpoint.catalog.tier_copy.damage import mark_damaged_shards
from tierpoint.config import Settings
from tierpoint.contract.integrity import RepairCopyInput, RepairPlanInput
from tierpoint.contract.lifecycle import CopyInput, PlanInput, PromoteInput, SealInput
from tierpoint.states import ReplicaState


def _set_marker(sessions: sessionmaker[Session], cp: int, tier: str, state: str) -> None:
    with sessions.begin() as s:
        s.execute(
            update(TierCopy)
            .where(TierCopy.checkpoint_id == cp, TierCopy.tier == tier)
            .values(state=state)
        )


def test_a_rotten_copy_is_copied_again_from_the_fastest_verified_tier(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = seed_checkpoint(settings, sessions, new_job(), 2, random_shards(["node-a"], 3, 4096))
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step
    stores = Stores(settings)
    lifecycle = LifecycleActivities(sessions, settings, stores, node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(lifecycle.plan, PlanInput(checkpoint_id=cp)).batches
    env.run(
        lifecycle.seal_batch,
        SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd"),
    )
    env.run(lifecycle.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre"]))
    copy = CopyInput(
        checkpoint_id=cp, job=job, step=step, batch=batch, source="ssd", destination="lustre"
    )
    assert env.run(lifecycle.copy_batch, copy).verified == 3
    lustre = PromoteInput(checkpoint_id=cp, tier="lustre", later_tiers=["s3"])
    assert env.run(lifecycle.promote, lustre).state == "restorable"

    # Bit rot on the shared tier, found (as a scrub finds it): the replica corrupt, the tier
    # copy demoted.
    rotten = seeded.shards[1]
    f = shard_file(settings, "lustre", None, job, step, rotten.path)
    f.write_bytes(bytes(b ^ 0xFF for b in rotten.data))
    with sessions.begin() as s:
        ids = dict(s.execute(select(Shard.path, Shard.id).where(Shard.checkpoint_id == cp)).all())
        mark_damaged_shards(s, "lustre", {ids[rotten.path]: "bit rot"}, ReplicaState.CORRUPT, "t")

    on_node = RepairActivities(sessions, settings, stores, node="node-a")
    shared = RepairActivities(sessions, settings, stores)
    plan = env.run(on_node.plan, RepairPlanInput(checkpoint_id=cp))
    (tier,) = [t for t in plan.tiers if t.tier == "lustre"]
    (rb,) = tier.batches
    assert rb.on_node  # the fastest verified copy is on node-a's local tier
    repair = RepairCopyInput(
        checkpoint_id=cp, job=job, step=step, batch=rb.batch, destination="lustre"
    )
    # The shared worker cannot read node-a's tier: the batch's shards are not its share.
    assert env.run(shared.copy_batch, repair).shards == 0
    # Retention took the copy over since the plan: repair leaves it alone.
    _set_marker(sessions, cp, "lustre", "expiring")
    assert env.run(on_node.copy_batch, repair).shards == 0
    assert f.read_bytes() != rotten.data
    _set_marker(sessions, cp, "lustre", "failed")

    result = env.run(on_node.copy_batch, repair)
    assert (result.shards, result.verified, result.corrupt) == (1, 1, 0)
    assert f.read_bytes() == rotten.data
    with sessions() as s:
        shared_event, node_event = s.scalars(
            select(Event.detail)
            .where(Event.checkpoint_id == cp, Event.kind == "repaired")
            .order_by(Event.id)
        ).all()
    assert shared_event["repaired"] == 0 and shared_event["sources"] == {}
    assert node_event["sources"] == {"ssd": 1} and node_event["repaired"] == 1
    assert env.run(lifecycle.promote, lustre).state == "restorable"
