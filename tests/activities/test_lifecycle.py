"""The lifecycle activities (activities/lifecycle.py) run one by one on a real catalog and real
tiers: what a node worker refuses before it reads anything. What the seal and the copy do with
the bytes they read: test_seal.py and test_copy.py."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, SealInput


def test_local_tier_batches_of_another_node_are_refused(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, random_shards(["node-b"], 1, 10))
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    batch = Batch(node="node-b", first=0, last=0)
    seal = SealInput(
        checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=1, batch=batch, tier="ssd"
    )
    try:
        ActivityEnvironment().run(acts.seal_batch, seal)
    except Exception as exc:
        assert "not reachable" in str(exc)
        assert getattr(exc, "non_retryable", False)
    else:
        raise AssertionError("a node worker sealed another node's shards")
