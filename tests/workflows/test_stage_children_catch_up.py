"""A stage child is told of the nodes declared lost after its input was made and before it
existed (workflows/stage_children.py): the signals passed on in that window reach no workflow,
so without the catch-up the child waits on the lost node's queue for good. The window is a race
on a live lifecycle; here a parent makes it certain by handing the child an input made before a
loss it already knows of. Real Temporal dev server, the real stage workflow."""

from __future__ import annotations

import asyncio
import uuid

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tierpoint.contract.lifecycle import (
    Batch,
    LifecycleStatus,
    PlanTier,
    StageInput,
    StageResult,
)
from tierpoint.tier_config import TierKind
from workflows.checkpoint_lifecycle import CheckpointLifecycleStage
from workflows.stage_children import StageChildren

LOST = "node-catch-up-lost"
# Guards against a hang (what a child that missed the loss does), not a performance assertion.
TIMEOUT = 60.0


@workflow.defn(sandboxed=False)
class ChildAfterALoss:
    """A parent that knows `LOST` is lost while its child's input, made earlier, does not."""

    @workflow.run
    async def run(self, inp: StageInput) -> list[StageResult]:
        children = StageChildren(LifecycleStatus(stage="copy"), {LOST})
        return await children.run(
            "copy-lustre",
            inp.batches,
            len(inp.batches),
            lambda batches: inp.model_copy(update={"batches": batches}),
            at_once=True,
        )


async def test_a_child_started_after_a_loss_its_input_missed_is_told_of_it(
    client: Client,
) -> None:
    queue = f"catch-up-{uuid.uuid4().hex[:8]}"
    stage = StageInput(
        checkpoint_id=1,
        job="catch-up",
        step=1,
        tier=PlanTier(name="lustre", kind=TierKind.SHARED, parallelism=1),
        source=PlanTier(name="ssd", kind=TierKind.LOCAL, parallelism=1),
        # Its one batch waits on the lost node's queue, which no worker serves.
        batches=[Batch(node=LOST, first=0, last=0)],
        window_per_node=True,
        lost_nodes=[],
    )
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ChildAfterALoss, CheckpointLifecycleStage],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            ChildAfterALoss.run, stage, id=f"catch-up/{uuid.uuid4().hex}", task_queue=queue
        )
        (result,) = await asyncio.wait_for(handle.result(), TIMEOUT)
    assert (result.batches, result.failures) == (1, 1), result
    assert result.first_failure is not None
    assert f"node {LOST} was declared lost" in result.first_failure, result
