"""A worker process serving a few nodes' queues (the dev stack's two nodes, a host standing in for
a few) runs as many batches of one node at once as a worker of that node alone would, within the
process's thread cap: checkpoints registered back to back each seal on the node at once instead of
queueing two at a time behind each other (the sizing is tierpoint/node_fleet.py's). And a process
serving more nodes than its threads cover never takes a task it has no thread for: such a task is
started as far as the server knows, and cannot heartbeat while it waits.

By construction, not by timing: the node's local tier is read at 256 KiB/s, shared by every seal
on it, so each of the four 1 MiB seals takes seconds once running; the test waits until the
Temporal server shows all four started at once, and fails as soon as any of them is sealed before
that (a seal that waited for a free slot)."""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from tests.helpers.faults import eventually
from tests.helpers.lifecycle import ShardSpec, crc_hex, new_job, running_workers, seed_checkpoint
from tests.helpers.services import with_tier
from tierpoint import node_fleet
from tierpoint.catalog.models import TierCopy
from tierpoint.config import Settings
from tierpoint.contract.common import node_task_queue
from tierpoint.contract.lifecycle import SEAL_BATCH, LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle

SEALS = 4  # more than the two slots a queue of a process serving several nodes had
SIZE = 1024 * 1024
READ_LIMIT = 256 * 1024


async def test_a_process_serving_two_nodes_runs_a_nodes_batches_at_once(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    slow = with_tier(settings, "ssd", read_bandwidth_limit=READ_LIMIT)
    seeded = []
    for _ in range(SEALS):
        data = os.urandom(SIZE)
        shard = ShardSpec("node-a", "rank-0.bin", data, crc_hex(data))
        seeded.append(seed_checkpoint(slow, sessions, new_job(), 1, [shard]))
    ids = [s.checkpoint_id for s in seeded]

    def sealed() -> int:
        with sessions() as s:
            return len(
                s.scalars(
                    select(TierCopy.checkpoint_id).where(
                        TierCopy.checkpoint_id.in_(ids),
                        TierCopy.tier == "ssd",
                        TierCopy.state == "restorable",
                    )
                ).all()
            )

    # Both nodes' queues in this one process, as `tierpoint dev` serves them.
    async with running_workers(slow, client, nodes=["node-a", "node-b"]):
        for s in seeded:
            await start_lifecycle(
                client, LifecycleInput(checkpoint_id=s.checkpoint_id, job=s.job, step=s.step)
            )
        handles = [
            client.get_workflow_handle(workflow_id(s.job, s.step), result_type=LifecycleResult)
            for s in seeded
        ]

        async def all_sealing() -> bool:
            assert await asyncio.to_thread(sealed) == 0, "a seal ended while others waited"
            running = 0
            for h in handles:
                for pa in (await h.describe()).raw_description.pending_activities:
                    started = pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                    running += pa.activity_type.name == SEAL_BATCH and started
            return running == SEALS

        await eventually(f"{SEALS} seals of node-a running at once", all_sealing)
        results = await asyncio.gather(*(h.result() for h in handles))
    assert all(t.state == "restorable" for r in results for t in r.tiers), results


async def test_a_process_serving_more_nodes_than_its_threads_cover_takes_no_task_it_cannot_run(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three nodes against a cap of four threads stand in for 250 nodes against 64: one thread
    # per slot leaves a slot a node; two slots a node (six) would have run on four threads.
    monkeypatch.setattr(node_fleet, "SHARED_PROCESS_THREADS", 4)
    nodes = ["node-a", "node-b", "node-c"]
    threads = node_fleet.sizing(len(nodes)).threads
    slow = with_tier(settings, "ssd", read_bandwidth_limit=READ_LIMIT)
    seeded = []
    for node in nodes:
        for _ in range(2):
            data = os.urandom(SIZE // 2)
            shard = ShardSpec(node, "rank-0.bin", data, crc_hex(data))
            seeded.append(seed_checkpoint(slow, sessions, new_job(), 1, [shard]))
    handles = [
        client.get_workflow_handle(workflow_id(s.job, s.step), result_type=LifecycleResult)
        for s in seeded
    ]

    async with running_workers(slow, client, nodes=nodes):
        for s in seeded:
            await start_lifecycle(
                client, LifecycleInput(checkpoint_id=s.checkpoint_id, job=s.job, step=s.step)
            )
        done = await asyncio.gather(*(h.result() for h in handles))
    # From the server's own record: each seal from the event that started it to the one that
    # closed it (a sweep of `describe` over the workflows is no snapshot: a seal closed early in
    # the sweep and the one that took its slot later would both count).
    node_queues = {node_task_queue(n) for n in nodes}
    spans: list[tuple[float, int]] = []
    for h in handles:
        on_nodes: set[int] = set()  # the batches the node workers' threads run
        started: dict[int, float] = {}
        async for e in h.fetch_history_events():
            at = e.event_time.ToDatetime().timestamp()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                queue = e.activity_task_scheduled_event_attributes.task_queue.name
                if queue in node_queues:
                    on_nodes.add(e.event_id)
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                scheduled = e.activity_task_started_event_attributes.scheduled_event_id
                if scheduled in on_nodes:
                    started[scheduled] = at
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                opened = started.get(e.activity_task_completed_event_attributes.scheduled_event_id)
                if opened is not None:
                    spans += [(opened, 1), (at, -1)]
    running = most = 0
    for _, step in sorted(spans, key=lambda p: (p[0], p[1])):  # a close before an open at a tie
        running += step
        most = max(most, running)
    assert most <= threads, f"{most} batches started on a process of {threads} threads"
    assert all(t.state == "restorable" for r in done for t in r.tiers), done
    # Not vacuous: the batches did run side by side, one per node.
    assert most == threads, most
