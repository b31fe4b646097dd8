"""The contract between whoever starts a checkpoint's lifecycle workflow (the API right after
registration, the reconciler for any registered checkpoint without one) and the workflow itself."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from tierpoint.config import SHARED_TASK_QUEUE

LIFECYCLE_WORKFLOW = "CheckpointLifecycle"


class LifecycleInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int


def workflow_id(job: str, step: int) -> str:
    return f"checkpoint/{job}/{step}"


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
