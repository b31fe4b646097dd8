"""Asking for a job's retention run: one `JobRetention` workflow per job (id `retention/<job>`),
started or signalled in one call (signal-with-start), so there is one retention run per job at a
time and requests that arrive while it runs coalesce into one more pass."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.client import Client

from tierpoint.config import SHARED_TASK_QUEUE

RETENTION_WORKFLOW = "JobRetention"
REQUEST_SIGNAL = "request"


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
