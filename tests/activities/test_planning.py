"""The lifecycle's plan (activities/planning.py) run as its activity on a real catalog: batches cut
by the windows of the stages on the nodes' queues, not by a shared tier's."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tests.helpers.storage import MiB
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import PlanInput


def test_the_plan_splits_by_the_windows_of_the_node_stages_only(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    # Eight 1 MiB shards on one node, ranges of at least 1 MiB: the seal and the copy off the
    # local tier run 2 at once per node, so 2 ranges; the S3 tier's window of 64 (sized for a
    # cluster's shared workers) must not cut the node's shards into 8.
    tiers = [
        t.model_copy(update={"parallelism": {"ssd": 2, "lustre": 1, "s3": 64}[t.name]})
        for t in settings.tiers
    ]
    wide = settings.model_copy(update={"tiers": tiers, "min_batch_bytes": MiB})
    seeded = seed_checkpoint(wide, sessions, new_job(), 6, random_shards(["node-a"], 8, MiB))
    acts = LifecycleActivities(sessions, wide, Stores(wide), node=None)
    plan = ActivityEnvironment().run(acts.plan, PlanInput(checkpoint_id=seeded.checkpoint_id))
    assert [(b.first, b.last) for b in plan.batches] == [(0, 3), (4, 7)]
