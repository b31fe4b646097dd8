"""An admin deletes, with force, a checkpoint whose lifecycle is still running, and the job
registers the step again once every copy is expired: the new checkpoint must get a lifecycle of
its own.

It did not (found by the stateful test): the lifecycle's id is the step's, and starting it for the
new checkpoint joined the run still under that id, the deleted checkpoint's, which went on for a
row that no longer existed and ended. The new checkpoint was recorded as started and stayed
`pending` on every tier for good. The run of a deleted checkpoint now gives way: the new one
terminates it and starts its own.

By construction, not timing: no worker serves this module's task queues, so the first lifecycle
stays running; retention's end of each expiry is its own catalog step (`finish_expiry`), taken
here as its activity would take it once the bytes were gone."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from temporalio.client import Client, WorkflowExecutionStatus

from tests.helpers.api import manifest, shard
from tierpoint.catalog.tier_copy.expiry import finish_expiry
from tierpoint.contract.lifecycle import LifecycleInput, workflow_id

STEP = 5
WAIT_LIMIT = 60.0  # seconds: only a bound on a hang, never a timing assertion


def _checkpoint_id(catalog: Engine, job: str) -> int:
    with catalog.connect() as conn:
        cid: int = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": STEP},
        ).scalar_one()
    return cid


async def _until_started(client: httpx.AsyncClient, job: str) -> None:
    """Until the API says the checkpoint's lifecycle is known to run (it starts it after its
    answer)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT
    while True:
        r = await client.get(f"/v1/jobs/{job}/checkpoints/{STEP}")
        assert r.status_code == 200, r.text
        if r.json()["workflow_started"]:
            return
        assert loop.time() < deadline, "the lifecycle was never started"
        await asyncio.sleep(0.1)


async def _run_for(temporal: Client, job: str) -> tuple[int, str, WorkflowExecutionStatus | None]:
    """(the checkpoint id, run id and status of the latest run under the step's lifecycle id)."""
    handle = temporal.get_workflow_handle(workflow_id(job, STEP))
    desc = await handle.describe()
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        (first,) = await temporal.data_converter.decode(payloads[:1], [LifecycleInput])
        assert isinstance(first, LifecycleInput)
        return first.checkpoint_id, desc.run_id, desc.status
    raise AssertionError("the lifecycle has no history")


async def test_a_step_deleted_in_flight_and_registered_again_gets_a_lifecycle_of_its_own(
    client: httpx.AsyncClient, catalog: Engine, job: str, temporal: Client
) -> None:
    path = f"/v1/jobs/{job}/checkpoints"
    r = await client.post(path, json=manifest(STEP, [shard("a.bin", size=100)]))
    assert r.status_code == 201, r.text
    old = _checkpoint_id(catalog, job)
    await _until_started(client, job)
    old_run = await _run_for(temporal, job)
    assert old_run[0] == old and old_run[2] is WorkflowExecutionStatus.RUNNING, old_run

    r = await client.delete(f"{path}/{STEP}", params={"force": "true"})
    assert r.status_code == 202, r.text
    assert r.json()["deleted"][0]["overrode"] == ["in flight"], r.text
    with Session(catalog) as s:
        for tier in ("ssd", "lustre", "s3"):
            assert finish_expiry(s, old, tier) == "expired"
        s.commit()

    r = await client.post(path, json=manifest(STEP, [shard("a.bin", size=200)]))
    assert r.status_code == 201, r.text
    new = _checkpoint_id(catalog, job)
    assert new != old
    await _until_started(client, job)
    run = await _run_for(temporal, job)
    assert run[0] == new, f"the step's lifecycle runs for the deleted checkpoint {old}: {run}"
    assert run[2] is WorkflowExecutionStatus.RUNNING, run
    # The deleted checkpoint's run is over.
    gone = await temporal.get_workflow_handle(workflow_id(job, STEP), run_id=old_run[1]).describe()
    assert gone.status is WorkflowExecutionStatus.TERMINATED, gone.status
