"""The copy and its read-back (activities/copy/), run through the lifecycle's activities one by
one on a real catalog and real tiers, for outcomes a whole workflow cannot time: bytes that rot
on the source between the seal and the copy, and reruns."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint, shard_file
from tierpoint.catalog.models import Replica, Shard, TierCopy
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import CopyInput, PlanInput, PromoteInput, SealInput


def test_source_rotting_after_seal_is_caught_by_the_copy(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = seed_checkpoint(settings, sessions, new_job(), 5, random_shards(["node-a"], 3, 4096))
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step

    plan = env.run(acts.plan, PlanInput(checkpoint_id=cp))
    assert [t.name for t in plan.tiers] == ["ssd", "lustre", "s3"]
    (batch,) = plan.batches
    seal = SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd")
    assert env.run(acts.seal_batch, seal).verified == 3
    ssd = env.run(
        acts.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre", "s3"])
    )
    assert ssd.state == "restorable"

    rotten = seeded.shards[0]
    f = shard_file(settings, "ssd", "node-a", job, step, rotten.path)
    f.write_bytes(bytes(b ^ 0xFF for b in rotten.data))
    gone = seeded.shards[2]
    shard_file(settings, "ssd", "node-a", job, step, gone.path).unlink()

    copy = CopyInput(
        checkpoint_id=cp, job=job, step=step, batch=batch, source="ssd", destination="lustre"
    )
    first = env.run(acts.copy_batch, copy)
    assert (first.verified, first.corrupt, first.skipped) == (1, 2, 0)
    assert rotten.path in first.problems[0] and gone.path in first.problems[1]

    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Replica.tier, Replica.state, Replica.error)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == cp)
        )
        replicas = {(p, t): (st, e) for p, t, st, e in rows}
        ssd_marker = s.execute(
            select(TierCopy.state, TierCopy.reason, TierCopy.quarantine_reason).where(
                TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd"
            )
        ).one()
    state, error = replicas[(rotten.path, "ssd")]
    assert rotten.crc32c is not None
    assert state == "corrupt" and error is not None and rotten.crc32c in error
    assert replicas[(rotten.path, "lustre")][0] == "corrupt"
    state, error = replicas[(gone.path, "ssd")]
    assert state == "corrupt" and error is not None and "cannot read from ssd" in error
    assert replicas[(seeded.shards[1].path, "lustre")][0] == "verified"
    # The tier promoted on these bytes is taken out of "latest restorable" as a scrub's finding
    # takes it: demoted, so that repair copies it again (a quarantine would keep it out forever).
    state, reason, quarantine = ssd_marker
    assert (state, quarantine) == ("failed", None)
    assert reason is not None and "corrupt on ssd (found by copy to lustre)" in reason
    assert (first.source_damaged, first.corrupt) == (2, 2)
    # What was written from bad bytes is not left where a reader could take it for a copy.
    assert not shard_file(settings, "lustre", None, job, step, rotten.path).exists()

    again = env.run(acts.copy_batch, copy)
    assert (again.verified, again.skipped) == (1, 1)
    # The source is known bad now: nothing is copied from it again.
    assert "no verified source replica on ssd (corrupt)" in again.problems[0]
    # ...and the copy still says so, for the lifecycle to ask for the repair.
    assert again.source_damaged == 2

    lustre = env.run(
        acts.promote, PromoteInput(checkpoint_id=cp, tier="lustre", later_tiers=["s3"])
    )
    assert lustre.state == "failed"
    assert lustre.reason is not None and "2 of 3 shards" in lustre.reason
    with sessions() as s:
        s3_marker = s.execute(
            select(TierCopy.state, TierCopy.reason).where(
                TierCopy.checkpoint_id == cp, TierCopy.tier == "s3"
            )
        ).one()
    assert tuple(s3_marker) == ("failed", "source tier lustre failed")
    # A demoted tier is not promoted again by a rerun: only repair, once every shard is verified
    # there again, promotes it.
    rerun = env.run(
        acts.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre", "s3"])
    )
    assert rerun.state == "failed"
