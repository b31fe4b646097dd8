"""Replaying committed histories of the retention workflow and of lifecycles with the retention
hook: a change that is not deterministic against what already ran fails here.

To record them again (after an intended, versioned change):
`TIERPOINT_RECORD_HISTORY=1 pytest tests/retention_e2e -k "issue or crash"` and commit the files.
"""

from __future__ import annotations

import json

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.checkpoint_lifecycle import CheckpointLifecycle, CheckpointLifecycleStage
from workflows.retention import JobRetention, RetentionSweep

from .conftest import HISTORIES

RECORDED = {p.stem: p.read_text() for p in sorted(HISTORIES.glob("*.json"))}


def test_the_histories_are_recorded() -> None:
    assert {
        "job_retention_resumes",
        "lifecycle_requests_retention",
        "lifecycle_skips_s3",
    } <= set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_replay(name: str) -> None:
    recorded = json.loads(RECORDED[name])
    history = WorkflowHistory.from_json(recorded.pop("workflow_id"), recorded)
    replayer = Replayer(
        workflows=[JobRetention, RetentionSweep, CheckpointLifecycle, CheckpointLifecycleStage],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
