"""The workflows of workflows/scrub.py (the scheduled scrub itself: test_integrity_schedules.py).

`VerifyCheckpoint` on a node-local tier: the replicas of both nodes are read on each node's own
queue, a flipped byte on one node is found (marked corrupt, the tier demoted), and with one replica
per pick and two picks per run the workflow continues as new and still counts every replica once:
its history stays bounded however many shards a checkpoint has."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from tests.helpers.faults import OVERALL_TIMEOUT
from tests.helpers.integrity import events, flip_file, integrity_settings, promoted
from tests.helpers.lifecycle import running_workers
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.integrity import (
    VERIFY_CHECKPOINT_WORKFLOW,
    VerifyCheckpointInput,
    VerifyOutcome,
    verify_checkpoint_workflow_id,
)
from tierpoint.tier_config import TierKind


async def test_verify_checkpoint_reads_each_node_and_continues_as_new(
    settings: Settings, client: Client, capfd: pytest.CaptureFixture[str]
) -> None:
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine)
        bad = next(s for s in seeded.shards if s.node == "node-b")
        flip_file(cfg, "ssd", seeded, bad)
        wid = verify_checkpoint_workflow_id(seeded.job, seeded.step, "ssd")
        async with running_workers(cfg, client):
            handle = await client.start_workflow(
                VERIFY_CHECKPOINT_WORKFLOW,
                VerifyCheckpointInput(
                    checkpoint_id=seeded.checkpoint_id,
                    tier="ssd",
                    kind=TierKind.LOCAL,
                    pick_limit=1,
                    picks_per_run=2,
                ),
                id=wid,
                task_queue=SHARED_TASK_QUEUE,
                result_type=VerifyOutcome,
            )
            out = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
        assert (out.read, out.good, out.corrupt, out.lost) == (4, 3, 1, 0), out
        assert out.repair_requested and bad.path in out.problems[0], out
        (found,) = events(engine, seeded.checkpoint_id, "corrupt")
        assert found[1] == "ssd" and found[2]["marker_demoted"] is True, found
        # The workers' log says who found it: `verify`, not the scrub.
        logged = "".join(capfd.readouterr())
        assert "verify found a bad replica" in logged and "scrub found" not in logged, logged

        # 4 replicas, one per pick, two picks per run: a chain of three runs (histories read
        # run by run: visibility lists are only eventually consistent).
        runs, run_id = 0, handle.first_execution_run_id
        while run_id:
            history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
            runs += 1
            last = history.events[-1]
            continued = last.HasField("workflow_execution_continued_as_new_event_attributes")
            run_id = (
                last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                if continued
                else None
            )
        assert runs == 3
    finally:
        engine.dispose()
