"""Retention's activities (activities/retention.py) run one by one on a real catalog and real
files: the plan, the begin, a node's delete of its own files of the copy (only an `expiring`
copy, only the files the job registered and the catalog knows, a file written since kept and
recorded), and the finish; a delete that comes after the finish deletes nothing."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.exceptions import ApplicationError

from activities.retention import RetentionActivities
from activities.stores import Stores
from tests.helpers.catalog_rows import tier_copy_states, verified_everywhere
from tests.helpers.lifecycle import new_job, shard_file
from tests.helpers.retention import create_job
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Event
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.retention import DeleteInput, ExpiryInput, RetentionPlanInput

SSD_NONE = {"tiers": {"ssd": {"keep_last": 0}}}


def test_an_expiry_runs_plan_begin_delete_per_node_and_finish(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job = new_job()
    create_job(sessions, job, SSD_NONE)
    seeded = verified_everywhere(settings, sessions, job, 4)
    cp = seeded.checkpoint_id
    stores = Stores(settings)
    shared = RetentionActivities(sessions, settings, stores)
    on = {n: RetentionActivities(sessions, settings, stores, node=n) for n in ("node-a", "node-b")}

    (task,) = shared.plan(RetentionPlanInput(job=job)).tasks
    assert (task.checkpoint_id, task.tier, task.rule) == (cp, "ssd", "not_kept")
    assert sorted(task.nodes) == ["node-a", "node-b"]
    delete = {n: DeleteInput(job=job, checkpoint_id=cp, step=4, tier="ssd", node=n) for n in on}
    # Invariant 3 where the bytes go: a copy readers may still be sent to is never deleted.
    with pytest.raises(ApplicationError, match="not expiring") as refused:
        on["node-a"].delete_copy(delete["node-a"])
    assert refused.value.type == FailureType.NOT_EXPIRING and refused.value.non_retryable
    # A node's files are deleted only by that node's worker.
    with pytest.raises(ApplicationError, match="not reachable"):
        shared.delete_copy(delete["node-a"])

    assert shared.begin_expiry(ExpiryInput(job=job, checkpoint_id=cp, tier="ssd")).state == (
        "expiring"
    )
    files = {sh.path: shard_file(settings, "ssd", sh.node, job, 4, sh.path) for sh in seeded.shards}
    b_shards = [sh for sh in seeded.shards if sh.node == "node-b"]
    rewritten = files[b_shards[0].path]
    rewritten.write_bytes(b"written again since it was verified")
    on["node-a"].delete_copy(delete["node-a"])
    on["node-b"].delete_copy(delete["node-b"])
    assert [p for p, f in files.items() if f.exists()] == [b_shards[0].path]
    with sessions() as s:
        kept = s.scalars(
            select(Event.detail).where(Event.checkpoint_id == cp, Event.kind == EventKind.KEPT)
        ).all()
    assert [(k["node"], k["shards"]) for k in kept] == [("node-b", 1)]

    finished = asyncio.run(shared.finish_expiry(ExpiryInput(job=job, checkpoint_id=cp, tier="ssd")))
    assert finished.state == "expired"
    assert tier_copy_states(sessions, cp)["ssd"] == "expired"
    # A late attempt (a retry that outlived its timeout) finds the copy expired: nothing goes.
    rewritten.write_bytes(b"the step's next checkpoint")
    on["node-b"].delete_copy(delete["node-b"])
    assert rewritten.read_bytes() == b"the step's next checkpoint"


def test_the_plan_of_a_job_that_does_not_exist_is_empty(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    shared = RetentionActivities(sessions, settings, Stores(settings))
    assert shared.plan(RetentionPlanInput(job=new_job())).tasks == []
    gone = shared.begin_expiry(ExpiryInput(job=new_job(), checkpoint_id=-1, tier="ssd"))
    assert gone.state == "skipped"
