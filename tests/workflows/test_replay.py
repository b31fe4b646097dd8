"""Replaying committed histories: a change to the workflow that is not deterministic against
what already ran in production fails here, before it reaches a cluster.

To record a new history (after an intended, versioned change), run
`TIERPOINT_RECORD_HISTORY=1 pytest tests/workflows -k "two_nodes or child"` and commit the
files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tierpoint.contract.lifecycle import LIFECYCLE_WORKFLOW, STAGE_WORKFLOW
from workflows.checkpoint_lifecycle import CheckpointLifecycle, CheckpointLifecycleStage

HISTORIES = {
    p.stem: p.read_text() for p in sorted((Path(__file__).parent / "histories").glob("*.json"))
}


def test_there_is_a_history_to_replay() -> None:
    assert HISTORIES, "tests/workflows/histories/ holds no recorded history"


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_replay(name: str) -> None:
    recorded = json.loads(HISTORIES[name])
    workflow_id = recorded.pop("workflow_id")
    started = recorded["events"][0]["workflowExecutionStartedEventAttributes"]
    assert started["workflowType"]["name"] in (LIFECYCLE_WORKFLOW, STAGE_WORKFLOW)
    history = WorkflowHistory.from_json(workflow_id, recorded)
    replayer = Replayer(
        workflows=[CheckpointLifecycle, CheckpointLifecycleStage],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
