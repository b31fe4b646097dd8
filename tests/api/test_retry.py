"""Retry, end to end: a checkpoint registered a moment before its file was written fails on the
local tier ("a.bin (missing)"); once the file is there, an operator's retry makes it restorable
on every tier with a new lifecycle run, recorded as an event with the actor. A second retry has
nothing to do; an unknown checkpoint is 404."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import crc32c
import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import (
    NODE_A,
    events,
    manifest,
    running_client,
    seed,
    set_marker,
    set_replicas,
    shard,
)
from tests.helpers.lifecycle import running_workers, shard_file
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy import damage
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import retry_workflow_id
from tierpoint.states import ReplicaState

DATA = b"weights written after the registration" * 1000
# Guards against a hang, not a performance assertion.
TIMEOUT = 120.0


@pytest.fixture
async def stack(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_workers(settings, temporal):
        async for c in running_client(create_app(settings)):
            yield c


async def states(c: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def settle(c: httpx.AsyncClient, job: str, step: int, want: set[str]) -> dict[str, str]:
    async with asyncio.timeout(TIMEOUT):
        while True:
            now = await states(c, job, step)
            if set(now.values()) <= want and "pending" not in now.values():
                return now
            await asyncio.sleep(0.2)


async def test_retry_after_the_file_appears_makes_it_restorable(
    stack: httpx.AsyncClient, settings: Settings, catalog: Engine, job: str
) -> None:
    crc = f"{crc32c.crc32c(DATA):08x}"
    body = manifest(1, [shard("a.bin", size=len(DATA), crc=crc)])
    r = await stack.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    failed = await settle(stack, job, 1, {"failed"})
    assert failed == {"ssd": "failed", "lustre": "failed", "s3": "failed"}
    detail = (await stack.get(f"/v1/jobs/{job}/checkpoints/1")).json()
    ssd = next(t for t in detail["tiers"] if t["tier"] == "ssd")
    assert "a.bin (missing)" in ssd["reason"], ssd

    f = shard_file(settings, "ssd", NODE_A, job, 1, "a.bin")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(DATA)

    r = await stack.post(f"/v1/jobs/{job}/checkpoints/1/retry")
    assert r.status_code == 202, r.text
    out = r.json()
    assert out["workflow_id"] == retry_workflow_id(job, 1, 1) and out["attempt"] == 1
    assert out["tiers"] == ["lustre", "s3", "ssd"]
    # Pending again at once: in flight, not failed.
    assert set((await states(stack, job, 1)).values()) <= {"pending", "restorable"}

    done = await settle(stack, job, 1, {"restorable"})
    assert done == {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}
    latest = (await stack.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
    assert latest["step"] == 1

    actions = [e for e in events(catalog, "operator_action", job=job)]
    assert len(actions) == 1 and actions[0]["detail"]["action"] == "retry"
    assert actions[0]["detail"]["reasons"]["ssd"] and actions[0]["actor"]

    r = await stack.post(f"/v1/jobs/{job}/checkpoints/1/retry")
    assert r.status_code == 409 and r.json()["code"] == "nothing_to_retry"
    assert len(events(catalog, "operator_action", job=job)) == 1


async def test_retry_of_an_unknown_checkpoint(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    r = await client.post(f"/v1/jobs/{job}/checkpoints/3/retry")
    assert r.status_code == 404 and r.json()["code"] == "job_not_found"
    await seed(client, catalog, job, [1], tiers=())
    r = await client.post(f"/v1/jobs/{job}/checkpoints/3/retry")
    assert r.status_code == 404 and r.json()["code"] == "checkpoint_not_found"


async def test_retry_without_a_verified_source_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """The copies a new run would start from are expired and the last one was found lost: a
    retry could never finish (its tiers would stay `pending` for good). It is refused, naming
    what is gone, and the failure stays where operators see it."""
    await seed(client, catalog, job, [200], tiers=("ssd", "lustre", "s3"))
    for tier in ("ssd", "lustre"):
        set_replicas(catalog, job, 200, tier, "expired", local=tier == "ssd")
        set_marker(catalog, job, 200, tier, "expired")
    set_replicas(catalog, job, 200, "s3", "lost")
    set_marker(catalog, job, 200, "s3", "failed", reason="2 shard(s) lost on s3")
    before = await states(client, job, 200)

    r = await client.post(f"/v1/jobs/{job}/checkpoints/200/retry")
    assert r.status_code == 409, r.text
    problem = r.json()
    assert problem["code"] == "no_verified_source"
    assert "ssd is expired" in problem["detail"] and "lustre is expired" in problem["detail"]
    assert "2 shard(s) lost on s3" in problem["detail"]
    assert problem["gone"] == {"ssd": "expired", "lustre": "expired"}

    assert await states(client, job, 200) == before
    failures = (await client.get("/v1/failures", params={"job": job})).json()["items"]
    assert [(f["step"], f["tier"]) for f in failures] == [(200, "s3")]
    assert events(catalog, "operator_action", job=job) == []


async def test_a_reseal_never_marks_an_expired_replica(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A lifecycle run that reads a local copy retention deleted finds its file missing: the
    replica stays `expired` (its bytes are gone on purpose), it is not `corrupt`."""
    await seed(client, catalog, job, [7], tiers=("ssd",))
    set_replicas(catalog, job, 7, "ssd", "expired", local=True)
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.checkpoint_id, r.shard_id FROM replica r JOIN checkpoint c "
                "ON c.id = r.checkpoint_id JOIN job j ON j.id = c.job_id WHERE j.name = :job"
            ),
            {"job": job},
        ).all()
    cid = rows[0].checkpoint_id
    sessions = sessionmaker(catalog)
    with sessions.begin() as s:
        upsert_replicas(
            s,
            cid,
            "ssd",
            [ReplicaWrite(r.shard_id, ReplicaState.CORRUPT, "x", NODE_A, 0, "gone") for r in rows],
        )
        damage.mark_damaged_shards(
            s, "ssd", {r.shard_id: "gone" for r in rows}, ReplicaState.CORRUPT, "test"
        )
    with catalog.connect() as conn:
        after = conn.execute(
            text("SELECT DISTINCT state FROM replica WHERE checkpoint_id = :cid"), {"cid": cid}
        ).scalars()
        assert list(after) == ["expired"]
