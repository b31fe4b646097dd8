"""The lifecycle's own retention request is enough: checkpoints registered and run through their
normal lifecycle, with no request from the test and no sweep, leave exactly the newest copies the
policy keeps on the local tier; the older local copies are expired and their files gone."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import running_workers
from tests.helpers.retention import (
    NODES,
    create_job,
    markers,
    replica_states,
    settle,
    steps_on_disk,
)
from tests.helpers.retention import write_checkpoint as run_checkpoint
from tierpoint.config import Settings
from tierpoint.contract.retention import SWEEP_REASON, retention_workflow_id
from workflows.retention import JobRetention

CHECKPOINTS = 4
KEEP_LOCAL = 2
POLICY = {"tiers": {"ssd": {"keep_last": KEEP_LOCAL}}}


async def test_promotions_alone_expire_the_oldest_local_copies(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = f"trigger-{uuid.uuid4().hex[:10]}"
    create_job(sessions, job, POLICY)
    # The sweep schedule must not fire during the test: only the lifecycle asks for retention.
    quiet = settings.model_copy(update={"retention_sweep_interval": timedelta(days=3650)})
    steps = list(range(1, CHECKPOINTS + 1))
    async with running_workers(quiet, client):
        for step in steps:
            _, result = await run_checkpoint(quiet, sessions, client, job, step)
            assert all(t.state == "restorable" for t in result.tiers), result
        # Each lifecycle asked for a retention run before it ended, so the job's run (the latest
        # one) has seen every promotion: wait for it, without asking for anything.
        outcome = await settle(client, job, request=False)
        status = await client.get_workflow_handle(retention_workflow_id(job)).query(
            JobRetention.status
        )

    old, kept = steps[:-KEEP_LOCAL], steps[-KEEP_LOCAL:]
    assert outcome.failed == 0, outcome
    assert status.last_reasons, status
    assert all(r.startswith("step ") and "restorable on" in r for r in status.last_reasons), status
    assert SWEEP_REASON not in status.last_reasons
    state = markers(sessions, job)
    assert {s for (s, t), st in state.items() if t == "ssd" and st == "expired"} == set(old)
    assert {s for (s, t), st in state.items() if t == "ssd" and st == "restorable"} == set(kept)
    assert all(st == "restorable" for (_, t), st in state.items() if t != "ssd")
    replicas = replica_states(sessions, job)
    for step in old:
        assert replicas[(step, "ssd")] == {"expired"}
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == set(kept), node
    assert steps_on_disk(settings.tier("lustre").root_for(None), job) == set(steps)
