"""A restart storm's leases, released: only a release that leaves the checkpoint unleased asks
for a retention run, and that run expires what the leases held. Real API, real Temporal, real
workers, real files (the retention end-to-end tests' job and checkpoints)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.lifecycle import running_workers
from tests.helpers.retention import (
    NODES,
    create_job,
    markers,
    settle,
    steps_on_disk,
    write_checkpoint,
)
from tierpoint.config import Settings
from tierpoint.contract.retention import retention_workflow_id

LEASES = 100
SSD_LAST_1 = {"tiers": {"ssd": {"keep_last": 1}}}
RELEASED = "lease released"


async def _requests(client: Client, job: str, reason: str) -> int:
    """Retention requests for `job` with `reason` that reached Temporal: the signals (a start's
    signal included) in every run of the job's retention workflow."""
    found = 0
    wid = retention_workflow_id(job)
    converter = client.data_converter.payload_converter
    async for run in client.list_workflows(f"WorkflowId = '{wid}'"):
        history = await client.get_workflow_handle(wid, run_id=run.run_id).fetch_history()
        for event in history.events:
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                continue
            payloads = event.workflow_execution_signaled_event_attributes.input.payloads
            args: list[Any] = converter.from_payloads(list(payloads))
            found += sum(1 for a in args if isinstance(a, dict) and a.get("reason") == reason)
    return found


async def test_a_storm_of_releases_asks_once_and_the_last_release_gets_the_copy_expired(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = f"ret-{uuid.uuid4().hex[:10]}"
    create_job(sessions, job, SSD_LAST_1)
    async with running_workers(settings, client):
        await write_checkpoint(settings, sessions, client, job, 1)
        await settle(client, job)
        async for api in running_client(create_app(settings)):
            url = f"/v1/jobs/{job}/checkpoints/1/leases"
            ids = []
            for rank in range(LEASES):
                r = await api.post(url, json={"ttl_seconds": 3600, "holder": f"rank-{rank}"})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            # keep_last=1 on ssd wants step 1 gone once step 2 is there; the leases hold it.
            await write_checkpoint(settings, sessions, client, job, 2)
            held = await settle(client, job)
            assert held.expired == 0
            assert markers(sessions, job)[(1, "ssd")] == "restorable"
            before = await _requests(client, job, RELEASED)
            for lease_id in ids:  # one after the other: each release's request is sent or not
                assert (await api.delete(f"{url}/{lease_id}")).status_code == 204
        # The last release asked for the run; wait for it, asking for nothing more.
        done = await settle(client, job, request=False)
    assert await _requests(client, job, RELEASED) - before == 1
    assert done.expired == 1
    assert markers(sessions, job)[(1, "ssd")] == "expired"
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == {2}
