"""A coded peer tier's copy stage over more batches than a child holds, on real services (four
node workers with their data endpoints, the shared worker, a real Temporal server, the catalog
with its migrations): each pass (encode, pull, unstage) runs in children of the stage workflow,
the passes one after the other, so the lifecycle's history holds no batch of it however many
nodes a checkpoint has; and a node declared lost while the holders pull reaches the children
that wait on its queue. Scaled down as test_lifecycle_window.py is: 2 shards per batch, 3
batches per child."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from tierpoint_client.erasure.files import StripeFile, decode_path

from tests.helpers.coded_tier import (
    CODE,
    NODES,
    SECRET,
    coded_settings,
    coded_stack,
    declare_lost,
    stripe_rows,
)
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    activities_run,
    crc_hex,
    markers,
    new_job,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    seed_checkpoint,
)
from tests.workflows.test_lifecycle_window import children_of_three
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings
from tierpoint.contract import retention as retention_contract
from tierpoint.contract.common import node_task_queue
from tierpoint.contract.lifecycle import (
    PLAN,
    PROMOTE,
    LifecycleInput,
    LifecycleResult,
    LifecycleStatus,
    workflow_id,
)
from tierpoint.contract.stripes import PULL_BATCH
from tierpoint.services import node_lost
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.temporal import start_lifecycle

SOURCES = ("node-a", "node-b")
# 5 shards per node, 2 per batch: 3 batches per node, 6 to encode and to unstage (2 children
# each), and each batch pulled by its set's 3 holders, 18 (6 children).
PER_NODE = 5
PASSES = {"encode": 2, "pull": 6, "unstage": 2}


@pytest.fixture
def coded(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return children_of_three(coded_settings(settings, tmp_path, data_token=SECRET), monkeypatch)


def _children(history: WorkflowHistory) -> tuple[dict[str, int], dict[str, int]]:
    """Each child's id: where in the parent's history it was started, and where it completed."""
    started: dict[str, int] = {}
    done: dict[str, int] = {}
    for i, e in enumerate(history.events):
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            started[e.start_child_workflow_execution_initiated_event_attributes.workflow_id] = i
        elif e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            attrs = e.child_workflow_execution_completed_event_attributes
            done[attrs.workflow_execution.workflow_id] = i
    return started, done


def _queues(history: WorkflowHistory) -> dict[int, str]:
    """The batch activities a history scheduled: event id -> task queue."""
    return {
        e.event_id: e.activity_task_scheduled_event_attributes.task_queue.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }


async def test_every_pass_of_a_coded_copy_runs_in_children_of_the_stage(
    coded: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    shards = random_shards(SOURCES, PER_NODE, 3000)
    seeded = seed_checkpoint(coded, sessions, new_job(), 4, shards)
    async with coded_stack(coded, client, engine, NODES):
        result, handle = await run_lifecycle(client, seeded)
        history = await handle.fetch_history()
        if recording_histories():
            await record_history(client, handle.id, "lifecycle_coded_many_batches")
        status = await handle.query("status", result_type=LifecycleStatus)
        children = {
            c: await client.get_workflow_handle(c).fetch_history()
            for c in _children(history)[0]
            if "/pull-coded/" in c
        }

    outcome = {t.tier: t.state.value for t in result.tiers}
    assert set(outcome.values()) == {"restorable"}, markers(sessions, seeded.checkpoint_id)
    # The copies' status counts every batch of the passes run in children: lustre's and s3's 6
    # each, and the coded tier's 6 + 18 + 6.
    assert (status.batches_total, status.batches_done) == (42, 42), status
    # The lifecycle's own history: plan, and per tier a promote and a retention request; not one
    # encode, pull or unstage.
    queued, local = activities_run(history)
    assert not queued
    assert local == {PLAN: 1, PROMOTE: 4, retention_contract.REQUEST: 4}
    started, done = _children(history)
    for phase, count in PASSES.items():
        assert {c for c in started if f"/{phase}-coded/" in c} == {
            f"{handle.id}/{phase}-coded/{n}" for n in range(count)
        }, phase
    # The passes in order, each one's children at once.
    for before, after in (("encode", "pull"), ("pull", "unstage")):
        ends = [done[c] for c in done if f"/{before}-coded/" in c]
        starts = [started[c] for c in started if f"/{after}-coded/" in c]
        assert max(ends) < min(starts), (before, after)
    for phase in PASSES:
        ids = [c for c in started if f"/{phase}-coded/" in c]
        assert max(started[c] for c in ids) < min(done[c] for c in ids), phase
    # A holder's pulls of both nodes' sets in one child: one window per holder.
    assert all(len(set(_queues(h).values())) == 1 for h in children.values())

    rows = stripe_rows(sessions, seeded.checkpoint_id)
    assert len(rows) == len(shards) * CODE.width
    assert {r.state for r in rows} == {"verified"}
    tier = coded.tier("coded")
    for sh in shards:
        held = {r.stripe_index: r for r in rows if r.path == sh.path}
        files = [
            StripeFile(
                i, tier.root_for(held[i].holder) / seeded.job / "4" / sh.path, held[i].crc32c
            )
            for i in (CODE.k + CODE.m - 1, 0)
        ]
        out = tmp_path / "decoded" / sh.path
        out.parent.mkdir(parents=True, exist_ok=True)
        decode_path(CODE, len(sh.data), crc_hex(sh.data), files, out)
        assert out.read_bytes() == sh.data
    for node in SOURCES:
        staging = tier.root_for(node) / STAGING_DIR
        assert [p for p in staging.rglob("*") if p.is_file()] == []

    if recording_histories():
        await record_history(client, f"{handle.id}/pull-coded/0", "stage_child_coded")


async def _pulling_on(client: Client, workflow_id: str, node: str) -> str:
    """The workflow (the lifecycle or one of its pull children) that has scheduled a pull on
    `node`'s queue."""
    queue = node_task_queue(node)
    async with asyncio.timeout(RESULT_TIMEOUT):
        while True:
            parent = await client.get_workflow_handle(workflow_id).fetch_history()
            # Children the server has started (one only initiated may not exist yet).
            pulls = [
                e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                for e in parent.events
                if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
            ]
            pulls = [c for c in pulls if "/pull-coded/" in c]
            for wid in (workflow_id, *pulls):
                history = await client.get_workflow_handle(wid).fetch_history()
                scheduled = [
                    e.activity_task_scheduled_event_attributes
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                ]
                if any(
                    a.activity_type.name == PULL_BATCH and a.task_queue.name == queue
                    for a in scheduled
                ):
                    return wid
            await asyncio.sleep(0.2)


async def test_a_holder_lost_while_pulling_reaches_the_children_waiting_on_it(
    coded: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
) -> None:
    # node-d reported in, so the plan places a stripe of both sets on it, but no worker serves
    # its queue: its pulls wait until it is declared lost. A child the signal missed would wait
    # forever (the test's timeout).
    gone = "node-d"
    alive = [n for n in NODES if n != gone]
    shards = random_shards(SOURCES, PER_NODE, 3000)
    seeded = seed_checkpoint(coded, sessions, new_job(), 6, shards)
    with sessions.begin() as s:
        upsert_node(s, gone, {})
    async with coded_stack(coded, client, engine, alive):
        await start_lifecycle(
            client,
            LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step),
        )
        wid = workflow_id(seeded.job, seeded.step)
        waiting = await _pulling_on(client, wid, gone)
        assert waiting != wid, "the lifecycle ran the pull pass itself"
        lost = await declare_lost(coded, gone)
        assert (await node_lost.tell_lifecycles(client, lost)).signalled == 1
        handle = client.get_workflow_handle(wid, result_type=LifecycleResult)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        child = await client.get_workflow_handle(waiting).fetch_history()

    # Every pull the child scheduled on the lost node's queue was cancelled.
    on_gone = {i for i, q in _queues(child).items() if q == node_task_queue(gone)}
    cancelled = {
        e.activity_task_cancel_requested_event_attributes.scheduled_event_id
        for e in child.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    }
    assert on_gone and on_gone <= cancelled
    # Promoted through the stripes' coverage: node-d's stripe of each set is lost, so no set is
    # whole and the coded copy fails; the other tiers are copied.
    outcome = {t.tier: t.state.value for t in result.tiers}
    assert outcome == {
        "ssd": "restorable",
        "coded": "failed",
        "lustre": "restorable",
        "s3": "restorable",
    }
    state, reason = markers(sessions, seeded.checkpoint_id)["coded"]
    assert state == "failed" and f"node {gone} was declared lost" in (reason or ""), reason
