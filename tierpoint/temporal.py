"""The Temporal client side: connecting, starting a checkpoint's lifecycle, asking for a job's
retention run, and the retention sweep schedule. Workflows are started by name with inputs from
`tierpoint.contract`, so nothing here imports workflow code."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.lifecycle import (
    LIFECYCLE_WORKFLOW,
    NODE_LOST_SIGNAL,
    LifecycleInput,
    workflow_id,
)
from tierpoint.contract.retention import (
    REQUEST_SIGNAL,
    RETENTION_WORKFLOW,
    SWEEP_SCHEDULE_ID,
    SWEEP_WORKFLOW,
    RetentionInput,
    RetentionRequest,
    retention_workflow_id,
)


async def connect(settings: Settings) -> Client:
    """A Temporal client with the pydantic data converter (API, workers, tests and replay alike)."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
    )


async def start_lifecycle(client: Client, inp: LifecycleInput) -> bool:
    """Start the workflow for a registered checkpoint. Returns False if one already exists or
    existed: a checkpoint has exactly one lifecycle, however often this is called."""
    try:
        await client.start_workflow(
            LIFECYCLE_WORKFLOW,
            inp,
            id=workflow_id(inp.job, inp.step),
            task_queue=SHARED_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        return False
    return True


async def signal_node_lost(client: Client, job: str, step: int, node: str) -> bool:
    """Tell a checkpoint's lifecycle that `node` is lost. False if it is not running: not started
    yet (its plan will read the node as lost) or finished."""
    try:
        await client.get_workflow_handle(workflow_id(job, step)).signal(NODE_LOST_SIGNAL, node)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def request_retention(client: Client, job: str, reason: str) -> None:
    """Ask for a retention pass over `job`: starts the job's retention workflow, or signals the
    running one (which then runs one more pass after the current one, however many requests
    arrive meanwhile). Cheap and safe to call as often as wanted."""
    await client.start_workflow(
        RETENTION_WORKFLOW,
        RetentionInput(job=job),
        id=retention_workflow_id(job),
        task_queue=SHARED_TASK_QUEUE,
        start_signal=REQUEST_SIGNAL,
        start_signal_args=[RetentionRequest(reason=reason)],
    )


def _sweep_schedule(interval: timedelta) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            SWEEP_WORKFLOW,
            id=f"{SWEEP_SCHEDULE_ID}/run",
            task_queue=SHARED_TASK_QUEUE,
            execution_timeout=max(interval, timedelta(minutes=30)),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        # A sweep still running when the next is due makes the next one pointless.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_sweep_schedule(client: Client, interval: timedelta) -> None:
    """Create the `tierpoint.retention-sweep` schedule, or bring an existing one's action, interval
    and overlap policy up to date (keeping its state, e.g. paused by an operator). Safe to call
    from every shared worker at every start."""
    wanted = _sweep_schedule(interval)
    try:
        await client.create_schedule(SWEEP_SCHEDULE_ID, wanted)
        return
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
        have = current.description.schedule
        if have.spec.intervals == wanted.spec.intervals and have.policy == wanted.policy:
            return None
        return ScheduleUpdate(
            schedule=dataclasses.replace(
                have, action=wanted.action, spec=wanted.spec, policy=wanted.policy
            )
        )

    await client.get_schedule_handle(SWEEP_SCHEDULE_ID).update(update)
