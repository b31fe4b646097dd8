"""The seal (activities/seal.py), run through the lifecycle's seal activity on a real catalog and
real files: each shard the job wrote is read on its node's local tier and recorded verified only
when its bytes are the registered ones; a checksum the job left out is computed and recorded; a
shard already verified is not read again."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import crc_hex, new_job, random_shards, seed_checkpoint, shard_file
from tierpoint.catalog.models import Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import PlanInput, SealInput


def test_a_seal_verifies_the_registered_bytes_and_refuses_others(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    good, unsent, changed, missing = random_shards(["node-a"], 4, 2048)
    unsent = replace(unsent, crc32c=None)  # the job sent no checksum: the seal computes it
    seeded = seed_checkpoint(settings, sessions, new_job(), 3, [good, unsent, changed, missing])
    job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
    # After registration: one file written again, one removed.
    shard_file(settings, "ssd", "node-a", job, step, changed.path).write_bytes(b"x" * 2048)
    shard_file(settings, "ssd", "node-a", job, step, missing.path).unlink()
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=cp)).batches
    seal = SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd")

    first = env.run(acts.seal_batch, seal)
    assert (first.verified, first.corrupt, first.skipped) == (2, 2, 0)
    assert first.bytes == 3 * 2048  # the missing file read nothing
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Shard.checksum, Replica.state, Replica.error, Replica.file_identity)
            .join(Replica, Replica.shard_id == Shard.id)
            .where(Shard.checkpoint_id == cp, Replica.tier == "ssd")
        )
        found = {r.path: r for r in rows}
    assert found[good.path].state == "verified" and found[good.path].file_identity is not None
    assert found[unsent.path].state == "verified"
    assert found[unsent.path].checksum == crc_hex(unsent.data)
    assert changed.crc32c is not None
    assert found[changed.path].state == "corrupt"
    assert changed.crc32c in (found[changed.path].error or "")
    # A file that is not the registered one is never recorded as one a delete may remove.
    assert found[changed.path].file_identity is None
    assert found[missing.path].state == "corrupt"

    # A rerun reads only what is not verified yet.
    again = env.run(acts.seal_batch, seal)
    assert (again.verified, again.corrupt, again.skipped) == (2, 2, 2), again
