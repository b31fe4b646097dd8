"""A lifecycle stage's batches (workflows/lifecycle_window.py) on real services: many batches run
in child workflows, each node's stage children at once and the shared stage's one after the other,
and a node declared lost reaches every child that holds its batches."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError

import activities.planning
from tests.helpers.lifecycle import (
    NODES,
    RESULT_TIMEOUT,
    activities_run,
    assert_bytes_everywhere,
    markers,
    new_job,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.services import Services
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.config import Settings
from tierpoint.contract import retention as retention_contract
from tierpoint.contract.lifecycle import (
    PLAN,
    PROMOTE,
    LifecycleInput,
    LifecycleResult,
    workflow_id,
)
from tierpoint.services import node_lost
from tierpoint.temporal import start_lifecycle


def children_of_three(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Checkpoints over thousands of nodes have thousands of batches per stage, in child
    workflows of 1,000; the same path, scaled down: 2 shards per batch, 3 batches per child."""
    monkeypatch.setattr(activities.planning, "BATCHES_PER_CHILD", 3)
    return settings.model_copy(update={"shard_batch_size": 2})


async def test_stage_with_many_batches_runs_in_child_workflows(
    settings: Settings,
    services: Services,
    sessions: sessionmaker[Session],
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 7 shards per node: 8 batches per stage, at most 3 per child workflow.
    small_batches = children_of_three(settings, monkeypatch)
    seeded = seed_checkpoint(small_batches, sessions, new_job(), 9, random_shards(NODES, 7, 2000))

    async with running_workers(small_batches, client):
        result, handle = await run_lifecycle(client, seeded)
        history = await handle.fetch_history()

    assert result.batches == 8
    assert [t.state for t in result.tiers] == ["restorable"] * 3
    assert_bytes_everywhere(small_batches, services, seeded)
    children = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(children) == 3 * 3  # three stages (seal, copy, copy) of ceil(8 / 3) children
    # Every stage runs on the nodes' queues (the seal on ssd, and both copies, which read the
    # sealed ssd copy), so each starts all its children at once, each node keeping its own window.
    # (A stage on the shared queue runs them one after the other so that its one window holds;
    # the lifecycle's copies had one before they fanned out from the sealed tier.)
    started: dict[str, int] = {}
    done: dict[str, int] = {}
    for i, e in enumerate(history.events):
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            started[e.start_child_workflow_execution_initiated_event_attributes.workflow_id] = i
        elif e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            attrs = e.child_workflow_execution_completed_event_attributes
            done[attrs.workflow_execution.workflow_id] = i
    for stage in ("seal-ssd", "copy-lustre", "copy-s3"):
        ids = [f"{handle.id}/{stage}/{n}" for n in range(3)]
        assert max(started[c] for c in ids) < min(done[c] for c in ids), stage
    queued, local = activities_run(history)
    # plan, and per tier a promote and a retention request, all local; batches ran in the
    # children
    assert not queued
    assert local == {PLAN: 1, PROMOTE: 3, retention_contract.REQUEST: 3}

    if recording_histories():
        await record_history(client, handle.id, "lifecycle_in_children")
        await record_history(client, f"{handle.id}/copy-lustre/0", "stage_child")


async def test_node_lost_reaches_every_child_running_its_batches(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The seal's children run at once: node-2's four batches sit in two of them (3 batches per
    # child, 4 per node), waiting on a queue no worker serves. Declared lost, both must give
    # them up; a child the signal missed would wait forever (the test's timeout).
    small_batches = children_of_three(settings, monkeypatch)
    alive, gone = NODES
    seeded = seed_checkpoint(small_batches, sessions, new_job(), 3, random_shards(NODES, 7, 512))

    async with running_workers(small_batches, client, nodes=[alive]):
        await start_lifecycle(
            client,
            LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step),
        )
        handle = client.get_workflow_handle(
            workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
        )
        seal = [f"{handle.id}/seal-ssd/{n}" for n in (1, 2)]
        async with asyncio.timeout(RESULT_TIMEOUT):
            while True:  # both children holding node-2's batches have started
                running = 0
                for child in seal:
                    try:
                        await client.get_workflow_handle(child).describe()
                        running += 1
                    except RPCError:
                        pass
                if running == len(seal):
                    break
                await asyncio.sleep(0.2)
        engine = make_async_engine(settings.database_url, pool_size=1)
        try:
            async with async_sessions(engine).begin() as s:
                lost = await node_lost.declare(s, small_batches, gone, "test")
        finally:
            await engine.dispose()
        told = await node_lost.tell_lifecycles(client, lost)
        assert told.signalled == 1
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

    assert [t.state for t in result.tiers] == ["failed"] * 3
    ssd = markers(sessions, seeded.checkpoint_id)["ssd"]
    assert ssd[0] == "failed" and f"node {gone} was declared lost" in str(ssd[1]), ssd
