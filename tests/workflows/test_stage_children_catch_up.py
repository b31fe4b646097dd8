"""A stage child is told of the nodes declared lost after its input was made and before it
existed (workflows/stage_children.py): the signals passed on in that window reach no workflow,
so without the catch-up the child waits on the lost node's queue for good. The window is a race
on a live lifecycle; here a parent makes it certain by handing the child an input made before a
loss it already knows of. Real Temporal dev server, the real stage workflow."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from tests.helpers.lifecycle import HISTORIES, record_history, recording_histories
from tierpoint.contract.lifecycle import (
    Batch,
    LifecycleStatus,
    PlanTier,
    StageInput,
    StageResult,
)
from tierpoint.tier_config import TierKind
from workflows.checkpoint_lifecycle import CheckpointLifecycleStage
from workflows.lifecycle_window import LostNodes
from workflows.stage_children import StageChildren

LOST = "node-catch-up-lost"
# Guards against a hang (what a child that missed the loss does), not a performance assertion.
TIMEOUT = 60.0
# This test's own parent's histories: test_replay replays the project's workflows only.
HARNESS = HISTORIES / "harness"


@workflow.defn(sandboxed=False)
class ChildAfterALoss:
    """A parent that knows `LOST` is lost while its child's input, made earlier, does not."""

    @workflow.run
    async def run(self, inp: StageInput) -> list[StageResult]:
        children = StageChildren(LifecycleStatus(stage="copy"), LostNodes([LOST]))
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
        if recording_histories():
            await record_history(client, handle.id, "stage_children_catch_up", folder=HARNESS)
            # The child, told of the loss by the catch-up: a project workflow, replayed there.
            child = f"{handle.id}/copy-lustre/0"
            await record_history(client, child, "stage_child_told_lost")
    assert (result.batches, result.failures) == (1, 1), result
    assert result.first_failure is not None
    assert f"node {LOST} was declared lost" in result.first_failure, result


def _harness_histories() -> list[Path]:
    return sorted(HARNESS.glob("*.json"))


async def test_the_recorded_catch_up_replays() -> None:
    """The parent's recorded commands (start, the catch-up's patch marker and signal, the
    child's result) are the ones the current StageChildren issues."""
    paths = _harness_histories()
    assert paths, f"no history recorded in {HARNESS}"
    replayer = Replayer(
        workflows=[ChildAfterALoss, CheckpointLifecycleStage],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    for path in paths:
        recorded = json.loads(path.read_text())
        history = WorkflowHistory.from_json(recorded.pop("workflow_id"), recorded)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
        assert result.replay_failure is None, path
