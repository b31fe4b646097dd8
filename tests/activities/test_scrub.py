"""The scrub's activities (activities/scrub.py) run one by one on a real catalog and real files:
a node's unit picks its own verified replicas not read for a while, reads them back, and a
replica whose bytes rotted or went is marked as such at once, its tier copy demoted for repair;
a good one is only stamped as scrubbed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.scrub import ScrubActivities, judge
from activities.stores import Stores
from tests.helpers.catalog_rows import tier_copy_states, verified_everywhere
from tests.helpers.lifecycle import crc_hex, new_job, shard_file
from tierpoint.catalog.models import Replica
from tierpoint.config import Settings
from tierpoint.contract.integrity import ScrubBatchInput, ScrubPickInput, ScrubUnit
from tierpoint.states import ReplicaState
from tierpoint.storage.base import VerifyResult
from tierpoint.tier_config import TierKind


def test_a_read_back_is_judged_by_the_registered_size_and_checksum() -> None:
    data = b"checkpoint bytes"
    crc = crc_hex(data)
    good = VerifyResult(ok=True, size=len(data), crc32c=crc)
    assert judge(good, len(data), crc.upper(), "ssd") == (ReplicaState.VERIFIED, None)
    gone = VerifyResult(ok=False, size=None, crc32c=None)
    assert judge(gone, len(data), crc, "ssd") == (ReplicaState.LOST, "missing on ssd")
    short = VerifyResult(ok=False, size=3, crc32c=crc)
    assert judge(short, len(data), crc, "ssd")[0] is ReplicaState.CORRUPT
    flipped = VerifyResult(ok=False, size=len(data), crc32c="00000000")
    state, why = judge(flipped, len(data), crc, "ssd")
    assert state is ReplicaState.CORRUPT and why is not None and "(read back)" in why


def test_a_nodes_unit_finds_rot_and_loss_and_demotes_the_copy(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job = new_job()
    seeded = verified_everywhere(settings, sessions, job, 3, age_days=10)
    unit = ScrubUnit(
        tier="ssd",
        kind=TierKind.LOCAL,
        node="node-a",
        bandwidth=0,
        budget=10**9,
        min_age_seconds=timedelta(days=7).total_seconds(),
    )
    node_a = ScrubActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    picked = env.run(node_a.pick, ScrubPickInput(unit=unit, budget=10**9))
    with sessions() as s:
        nodes = set(s.scalars(select(Replica.node_id).where(Replica.id.in_(picked.replica_ids))))
    assert nodes == {"node-a"} and len(picked.replica_ids) == 2

    rotten, gone = (sh for sh in seeded.shards if sh.node == "node-a")
    f = shard_file(settings, "ssd", "node-a", job, 3, rotten.path)
    f.write_bytes(bytes(b ^ 0xFF for b in rotten.data))
    shard_file(settings, "ssd", "node-a", job, 3, gone.path).unlink()
    batch = ScrubBatchInput(
        tier="ssd",
        node="node-a",
        replica_ids=picked.replica_ids,
        bandwidth=0,
        picked_at=picked.picked_at,
    )
    # A node's replicas are read on that node's worker only.
    elsewhere = ScrubActivities(sessions, settings, Stores(settings), node="node-b")
    with pytest.raises(ApplicationError, match="not reachable"):
        env.run(elsewhere.verify_batch, batch)

    result = env.run(node_a.verify_batch, batch)
    assert (result.replicas, result.corrupt, result.lost) == (0, 1, 1)
    assert result.damaged == [seeded.checkpoint_id]
    with sessions() as s:
        states = s.execute(
            select(Replica.node_id, Replica.state).where(
                Replica.checkpoint_id == seeded.checkpoint_id, Replica.tier == "ssd"
            )
        ).all()
    assert sorted(tuple(r) for r in states) == [
        ("node-a", "corrupt"),
        ("node-a", "lost"),
        ("node-b", "verified"),
        ("node-b", "verified"),
    ]
    assert tier_copy_states(sessions, seeded.checkpoint_id)["ssd"] == "failed"

    # Read again, nothing is read twice: the bad ones are no longer verified.
    again = env.run(node_a.verify_batch, batch)
    assert (again.skipped, again.corrupt, again.lost) == (2, 0, 0)
