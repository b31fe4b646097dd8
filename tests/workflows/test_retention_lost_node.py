"""A node declared lost leaves its checkpoints' local copies failed (its replicas `lost`, the other
nodes' shards still on their disks). Retention expires such a copy under the local tier's rules
like any other: once a newer checkpoint holds the tier's `keep_last`, the failed copy's marker and
replicas become `expired`, the live nodes' files of it are deleted on their own queues, and it
leaves the failures view; the durable tiers keep the checkpoint.

Real services (Temporal dev server, Postgres, moto S3, the API in the test process), real files
on three nodes' local roots and the shared root, real workers."""

from __future__ import annotations

import uuid

import httpx
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import (
    Seeded,
    running_workers,
)
from tests.helpers.retention import (
    create_job,
    markers,
    replica_states,
    settle,
    steps_on_disk,
    write_checkpoint,
)
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

SSD_LAST_1 = {"tiers": {"ssd": {"keep_last": 1}}}


async def _checkpoint(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    job: str,
    step: int,
    nodes: list[str],
) -> Seeded:
    seeded, result = await write_checkpoint(
        settings, sessions, client, job, step, size=4096, nodes=nodes
    )
    assert all(t.state == "restorable" for t in result.tiers), result
    return seeded


async def test_a_lost_nodes_failed_local_copy_expires_under_the_local_rules(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b, c = (f"{tag}-{x}" for x in "abc")
    job = f"lostret-{tag}"
    create_job(sessions, job, SSD_LAST_1)
    admin = create_token(settings.database_url, scopes=["admin"])
    ssd = settings.tier("ssd")
    async with (
        running_workers(settings, client, nodes=[a, b, c]),
        serving(create_app(settings)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await _checkpoint(settings, sessions, client, job, 1, [a, b])
        await settle(client, job)
        r = await http.post(f"/v1/nodes/{a}/lost")
        assert r.status_code == 200, r.text
        assert markers(sessions, job)[(1, "ssd")] == "failed"
        assert replica_states(sessions, job)[(1, "ssd")] == {"lost", "verified"}
        failures = (await http.get("/v1/failures", params={"job": job})).json()["items"]
        assert [(f["step"], f["tier"]) for f in failures] == [(1, "ssd")]

        # Node a's ranks restart on c: step 2 holds the local tier's keep_last now.
        await _checkpoint(settings, sessions, client, job, 2, [b, c])
        outcome = await settle(client, job)
        assert outcome.failed == 0, outcome
        failures = (await http.get("/v1/failures", params={"job": job})).json()["items"]

    state = markers(sessions, job)
    assert state[(1, "ssd")] == "expired", state
    assert replica_states(sessions, job)[(1, "ssd")] == {"expired"}
    # The durable tiers keep step 1; the local tier keeps step 2 only.
    assert (state[(1, "lustre")], state[(1, "s3")]) == ("restorable", "restorable"), state
    assert state[(2, "ssd")] == "restorable", state
    # b's files of step 1 are gone from its disk; the lost node's directory is not touched.
    assert steps_on_disk(ssd.root_for(b), job) == {2}
    assert steps_on_disk(ssd.root_for(a), job) == {1}
    assert failures == []
