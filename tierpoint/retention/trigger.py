"""Asking for a job's retention run: one `JobRetention` workflow per job (id `retention/<job>`),
started or signalled in one call (signal-with-start), so there is one retention run per job at a
time and requests that arrive while it runs coalesce into one more pass."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from pydantic import BaseModel
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

from tierpoint.config import SHARED_TASK_QUEUE

RETENTION_WORKFLOW = "JobRetention"
REQUEST_SIGNAL = "request"
SWEEP_WORKFLOW = "RetentionSweep"
SWEEP_SCHEDULE_ID = "tierpoint.retention-sweep"


class RetentionInput(BaseModel):
    job: str
    # A run starts with a pass to do (the start signal asked for it, or continue-as-new carried
    # a request over); False only for a run that should wait for a signal first.
    pending: bool = True
    passes_before: int = 0  # passes of earlier runs of this chain (continue-as-new), for status


class RetentionRequest(BaseModel):
    reason: str


def retention_workflow_id(job: str) -> str:
    return f"retention/{job}"


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
