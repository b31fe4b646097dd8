"""A workflow activation that a starved process runs for longer than the SDK's 2 s is not failed
as a deadlock on the project's workers; on the SDK's default it is (the control: the stall is
real)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from apps.worker_stalls import tolerate_stalls

STALL = 3.0  # seconds of one activation: past the SDK's 2, well within ours


@workflow.defn(sandboxed=False)
class Starved:
    """Stands in for an activation on a process that gets the CPU seconds late: it holds its
    thread as a busy loop would, without yielding."""

    @workflow.run
    async def run(self) -> str:
        end = time.monotonic() + STALL
        while time.monotonic() < end:
            time.sleep(0.05)  # noqa: ASYNC251 - the stall is the point
        return "done"


def _worker(client: Client, queue: str) -> Worker:
    return Worker(
        client, task_queue=queue, workflows=[Starved], workflow_runner=UnsandboxedWorkflowRunner()
    )


async def _failed_tasks(handle: WorkflowHandle[Starved, str]) -> list[str]:
    return [
        e.workflow_task_failed_event_attributes.failure.message
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def test_a_stalled_activation_completes_on_a_worker_that_tolerates_stalls(
    client: Client,
) -> None:
    queue = f"stalls-{uuid.uuid4().hex[:8]}"
    async with tolerate_stalls(_worker(client, queue)):
        handle = await client.start_workflow(
            Starved.run, id=f"starved-{uuid.uuid4().hex}", task_queue=queue
        )
        assert await handle.result() == "done"
    assert await _failed_tasks(handle) == []


async def test_the_sdks_default_fails_the_same_activation_as_a_deadlock(client: Client) -> None:
    queue = f"stalls-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        handle = await client.start_workflow(
            Starved.run,
            id=f"starved-{uuid.uuid4().hex}",
            task_queue=queue,
            run_timeout=timedelta(seconds=60),
        )
        deadline = time.monotonic() + 60
        try:
            while not (failed := await _failed_tasks(handle)):
                assert time.monotonic() < deadline, "the stall was never called a deadlock"
                await asyncio.sleep(0.2)
        finally:
            await handle.terminate("the control has seen what it came for")
    assert "deadlock" in failed[0].lower(), failed


def test_a_worker_without_workflows_is_left_as_it_is(client: Client) -> None:
    @activity.defn
    async def noop() -> None:
        pass

    worker = Worker(client, task_queue="stalls-none", activities=[noop])
    assert tolerate_stalls(worker) is worker


def test_an_sdk_that_moved_the_deadline_is_refused(client: Client) -> None:
    worker = _worker(client, "stalls-moved")
    del worker._workflow_worker._deadlock_timeout_seconds  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="deadlock timeout"):
        tolerate_stalls(worker)
