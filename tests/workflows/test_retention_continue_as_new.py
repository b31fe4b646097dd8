"""JobRetention keeps its history bounded: after `rounds_per_run` rounds with work still to do it
continues as new, and the next run of the chain picks up where the last stopped."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from tests.helpers.lifecycle import running_workers
from tests.helpers.retention import (
    NODES,
    create_job,
    markers,
    set_policy,
    settle,
    steps_on_disk,
    write_checkpoint,
)
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.retention import (
    RETENTION_WORKFLOW,
    RetentionInput,
    RetentionResult,
    retention_workflow_id,
)

KEEP_ALL: dict[str, object] = {"tiers": {}}
SSD_LAST_1 = {"tiers": {"ssd": {"keep_last": 1}}}


async def test_a_run_continues_as_new_and_the_chain_finishes_the_work(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = f"can-{uuid.uuid4().hex[:10]}"
    policy_id = create_job(sessions, job, KEEP_ALL)
    async with running_workers(settings, client):
        for step in (1, 2, 3):
            await write_checkpoint(settings, sessions, client, job, step)
        # The lifecycles' own retention requests ran under keep-everything: nothing expired.
        await settle(client, job, request=False)
        assert all(st == "restorable" for st in markers(sessions, job).values())

        set_policy(sessions, policy_id, SSD_LAST_1)
        # One round per run: the round that expires steps 1 and 2 on ssd leaves work "requested"
        # (it made progress), so the run must continue as new rather than loop on.
        handle = await client.start_workflow(
            RETENTION_WORKFLOW,
            RetentionInput(job=job, rounds_per_run=1),
            id=retention_workflow_id(job),
            task_queue=SHARED_TASK_QUEUE,
            result_type=RetentionResult,
        )
        final = await handle.result()

    first = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    assert (await first.describe()).status is WorkflowExecutionStatus.CONTINUED_AS_NEW
    events = [e async for e in first.fetch_history_events()]
    assert events[-1].event_type is EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    carried = events[-1].workflow_execution_continued_as_new_event_attributes
    decoded = await client.data_converter.decode(carried.input.payloads, [RetentionInput])
    assert decoded == [RetentionInput(job=job, pending=True, passes_before=1, rounds_per_run=1)]

    # The continued run did one more pass (found nothing left) and counts the chain's passes.
    assert final.passes == 2
    assert final.failed == 0
    state = markers(sessions, job)
    assert {s for (s, t), st in state.items() if t == "ssd" and st == "expired"} == {1, 2}
    assert state[(3, "ssd")] == "restorable"
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == {3}
