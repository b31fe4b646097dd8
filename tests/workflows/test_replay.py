"""Replaying committed histories: a change to a workflow that is not deterministic against what
already ran in production fails here, before it reaches a cluster. Every history under
`histories/` must replay with today's workflows; and a workflow changed on purpose must not.

To record new histories (after an intended, versioned change), run the recording tests with
`TIERPOINT_RECORD_HISTORY=LABEL` (`pytest tests/workflows -k "two_nodes_become or many_batches or
issue_scenario or crash_between or cuts_pulls or every_pass or finishes_first"`): each lands beside
the old one as `NAME@LABEL.json` (the `@contract` ones were recorded after the Temporal contract got
its one home, the `@local-steps` ones after plan, promote and the retention requests became local
activities, `@node-children` after the children of a stage on the nodes' queues began to run at
once, `@fan-out` after every copy began to read the sealed tier at once, `@coded-children` after the
passes of a coded tier's copy over many batches began to run in children, `@round-begin` after
retention began a round's expiries in one activity, `@count-fixed` after a stage stopped losing a
batch's finding of a corrupt source: the unlabelled `lifecycle_source_damage_first` lost it, and
replays without the repair request it should have made). Old histories stay.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import NondeterminismError

from tierpoint.contract.integrity import (
    RECONCILE_WORKFLOW,
    REPAIR_WORKFLOW,
    SCRUB_UNIT_WORKFLOW,
    SCRUB_WORKFLOW,
    VERIFY_CHECKPOINT_WORKFLOW,
    VERIFY_WORKFLOW,
)
from tierpoint.contract.lifecycle import (
    LIFECYCLE_WORKFLOW,
    STAGE_WORKFLOW,
    LifecycleInput,
    LifecycleResult,
)
from tierpoint.contract.peer import REREPLICATE_WORKFLOW
from tierpoint.contract.retention import RETENTION_WORKFLOW
from workflows.checkpoint_lifecycle import CheckpointLifecycle, CheckpointLifecycleStage
from workflows.registry import WORKFLOWS

HISTORIES = {
    p.stem: p.read_text() for p in sorted((Path(__file__).parent / "histories").glob("*.json"))
}


def _history(name: str) -> WorkflowHistory:
    recorded = json.loads(HISTORIES[name])
    return WorkflowHistory.from_json(recorded.pop("workflow_id"), recorded)


def _workflow_type(name: str) -> str:
    started = json.loads(HISTORIES[name])["events"][0]["workflowExecutionStartedEventAttributes"]
    return str(started["workflowType"]["name"])


def test_every_workflow_has_a_recorded_history() -> None:
    recorded = {_workflow_type(n) for n in HISTORIES}
    assert {
        LIFECYCLE_WORKFLOW,
        STAGE_WORKFLOW,
        RETENTION_WORKFLOW,
        REPAIR_WORKFLOW,
        SCRUB_WORKFLOW,
        SCRUB_UNIT_WORKFLOW,
        VERIFY_WORKFLOW,
        VERIFY_CHECKPOINT_WORKFLOW,
        RECONCILE_WORKFLOW,
        REREPLICATE_WORKFLOW,
    } <= recorded
    # The shapes later changes must keep replaying: children, a skipped tier, retention requests
    # after promotion, a retention run resumed after its workers stopped.
    assert {
        "lifecycle_two_nodes",
        "lifecycle_in_children",
        "stage_child",
        "lifecycle_skips_s3",
        "lifecycle_requests_retention",
        "job_retention_resumes",
        # Catalog steps as local activities, node stages windowed per node.
        "lifecycle_two_nodes@local-steps",
        "lifecycle_in_children@local-steps",
        "stage_child@local-steps",
        # The children of a stage on the nodes' queues at once.
        "lifecycle_in_children@node-children",
        # A copy that found its source corrupt, and the repair the lifecycle then asked for.
        "lifecycle_repairs_its_source",
        # A peer tier's stage on the holders' queues, and its copies made again after a loss.
        "lifecycle_with_peer_tier",
        "peer_rereplicate",
        # A re-replication told mid-copy that its new holder was lost, which then planned again.
        "peer_rereplicate_holder_lost",
        # A lost node's shards copied again from the tiers below, its holder lost too.
        "peer_rereplicate_from_below",
        # Copies made again from another peer tier's copy on its holder (the local one expired).
        "peer_rereplicate_from_peer",
        # A full-copy tier copied again and a coded tier's stripes cut again, at the same time.
        "peer_rereplicate_with_coded",
        # Every copy from the sealed tier at once, in the parent and in children, and the
        # repair asked for after a copy found the sealed copy corrupt.
        "lifecycle_two_nodes@fan-out",
        "lifecycle_in_children@fan-out",
        "stage_child@fan-out",
        "lifecycle_repairs_its_source@fan-out",
        # A coded peer tier's stage: encode on the shards' nodes, pull on the holders, unstage.
        "lifecycle_with_coded_tier",
        # Its passes over more batches than a child holds: every batch in the lifecycle (a run
        # under way before they ran in children), then each pass in children of the stage.
        "lifecycle_coded_many_batches",
        "lifecycle_coded_many_batches@coded-children",
        "stage_child_coded",
        # A retention round's expiries begun at once, under one plan.
        "job_retention_resumes@round-begin",
    } <= set(HISTORIES)


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_replay(name: str) -> None:
    # Under the sandbox, which the workers do without (apps/worker.py): a workflow that reaches
    # for a clock, randomness or I/O on a recorded path fails here too.
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(),
    )
    result = await replayer.replay_workflow(_history(name), raise_on_replay_failure=True)
    assert result.replay_failure is None


@workflow.defn(name=LIFECYCLE_WORKFLOW)
class LifecycleThatWaitsFirst(CheckpointLifecycle):
    """The lifecycle with one command added before its first activity: what an unversioned
    change (one not behind `workflow.patched`) looks like to a running workflow."""

    @workflow.run
    async def run(self, inp: LifecycleInput) -> LifecycleResult:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(inp)


async def test_a_changed_workflow_does_not_replay() -> None:
    """The replay tests can fail: the same history refuses a workflow whose commands differ."""
    replayer = Replayer(
        workflows=[LifecycleThatWaitsFirst, CheckpointLifecycleStage],
        data_converter=pydantic_data_converter,
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(
            _history("lifecycle_two_nodes"), raise_on_replay_failure=True
        )
