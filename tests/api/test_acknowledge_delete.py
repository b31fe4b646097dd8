"""Clearing what operators cannot fix and removing what should go: an acknowledged failure leaves
the failures view and the jobs' counts and stays in the history with the token's name; an admin's
deletion of a checkpoint (or a whole job) is refused while pinned, leased or in flight unless
forced, takes it out of "latest" at once, sends its bytes through retention's expiry (files gone,
markers expired), and lets the step be registered again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import crc32c
import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import (
    NODE_A,
    events,
    manifest,
    running_client,
    seed,
    set_marker,
    shard,
)
from tests.helpers.lifecycle import running_workers, shard_file
from tests.helpers.tokens import actor_name, as_token
from tierpoint.config import Settings

DATA = b"weights of a checkpoint an admin deletes" * 500
# Guards against a hang, not a performance assertion.
TIMEOUT = 120.0


def fail_again(catalog: Engine, job: str, step: int, tier: str) -> None:
    """The marker changes again (a retry's run failed once more): updated_at moves on."""
    with catalog.begin() as conn:
        conn.execute(
            text(
                "UPDATE checkpoint_tier SET updated_at = clock_timestamp() FROM checkpoint c, "
                "job j WHERE checkpoint_tier.checkpoint_id = c.id AND c.job_id = j.id AND "
                "j.name = :job AND c.step = :step AND checkpoint_tier.tier = :tier"
            ),
            {"job": job, "step": step, "tier": tier},
        )


async def failed_count(c: httpx.AsyncClient, job: str) -> int:
    r = await c.get("/v1/overview/jobs", params={"job": job})
    assert r.status_code == 200, r.text
    (row,) = r.json()["items"]
    return int(row["failed"])


async def test_an_acknowledged_failure_leaves_the_views_and_stays_in_the_history(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [5], tiers=("ssd", "lustre"))
    set_marker(catalog, job, 5, "s3", "failed", reason="s3: bucket gone")
    failures = (await client.get("/v1/failures", params={"job": job})).json()["items"]
    assert [(f["step"], f["tier"]) for f in failures] == [(5, "s3")]
    assert await failed_count(client, job) == 1

    r = await client.post(f"/v1/jobs/{job}/checkpoints/5/acknowledge", json={"tier": "s3"})
    assert r.status_code == 200, r.text
    assert r.json() == {"job": job, "step": 5, "acknowledged": {"s3": "s3: bucket gone"}}
    assert (await client.get("/v1/failures", params={"job": job})).json()["items"] == []
    assert await failed_count(client, job) == 0
    (ack,) = events(catalog, "acknowledged", job=job)
    assert actor_name(ack["actor"]) == "test-admin"
    assert ack["detail"] == {"reason": "s3: bucket gone"}
    history = (await client.get(f"/v1/jobs/{job}/checkpoints/5/events")).json()["items"]
    assert "acknowledged" in [e["kind"] for e in history]

    again = await client.post(f"/v1/jobs/{job}/checkpoints/5/acknowledge")
    assert again.status_code == 409 and again.json()["code"] == "nothing_to_acknowledge"
    assert len(events(catalog, "acknowledged", job=job)) == 1

    # A later change of the copy is a new failure: it shows again.
    fail_again(catalog, job, 5, "s3")
    failures = (await client.get("/v1/failures", params={"job": job})).json()["items"]
    assert [(f["step"], f["tier"]) for f in failures] == [(5, "s3")]


async def test_acknowledging_needs_an_operator_and_an_existing_checkpoint(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    r = await client.post(f"/v1/jobs/{job}/checkpoints/9/acknowledge")
    assert r.status_code == 404 and r.json()["code"] == "job_not_found"
    await seed(client, catalog, job, [1], tiers=())
    r = await client.post(f"/v1/jobs/{job}/checkpoints/9/acknowledge")
    assert r.status_code == 404 and r.json()["code"] == "checkpoint_not_found"


@pytest.fixture
async def stack(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_workers(settings, temporal):
        async for c in running_client(create_app(settings)):
            yield c


async def tier_states(c: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def until(c: httpx.AsyncClient, job: str, step: int, want: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        while True:
            if set((await tier_states(c, job, step)).values()) == {want}:
                return
            await asyncio.sleep(0.2)


async def register(c: httpx.AsyncClient, settings: Settings, job: str, step: int) -> None:
    f = shard_file(settings, "ssd", NODE_A, job, step, "a.bin")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(DATA)
    body = manifest(step, [shard("a.bin", size=len(DATA), crc=f"{crc32c.crc32c(DATA):08x}")])
    r = await c.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text


async def test_a_deleted_checkpoint_goes_through_expiry_and_its_step_comes_back(
    stack: httpx.AsyncClient, settings: Settings, catalog: Engine, job: str
) -> None:
    await register(stack, settings, job, 10)
    await register(stack, settings, job, 20)
    await until(stack, job, 10, "restorable")
    await until(stack, job, 20, "restorable")
    files = [
        shard_file(settings, t, NODE_A if t == "ssd" else None, job, 20, "a.bin")
        for t in ("ssd", "lustre")
    ]
    assert all(f.exists() for f in files)

    assert (await stack.put(f"/v1/jobs/{job}/checkpoints/20/pin")).status_code == 200
    refused = await stack.delete(f"/v1/jobs/{job}/checkpoints/20")
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "checkpoint_protected"
    assert refused.json()["protected"] == {"20": ["pinned"]}
    assert await tier_states(stack, job, 20) == {
        "ssd": "restorable",
        "lustre": "restorable",
        "s3": "restorable",
    }

    r = await stack.delete(f"/v1/jobs/{job}/checkpoints/20", params={"force": "true"})
    assert r.status_code == 202, r.text
    assert r.json()["deleted"] == [
        {"step": 20, "tiers": ["lustre", "s3", "ssd"], "overrode": ["pinned"]}
    ]
    # Out of "latest" at once: the job resumes from the step before.
    latest = (await stack.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
    assert latest["step"] == 10
    (deleted,) = events(catalog, "deleted", job=job)
    assert deleted["actor"] and deleted["detail"]["force"] is True

    await until(stack, job, 20, "expired")
    assert not any(f.exists() for f in files)
    assert shard_file(settings, "ssd", NODE_A, job, 10, "a.bin").exists()
    again = await stack.delete(f"/v1/jobs/{job}/checkpoints/20")
    assert again.status_code == 202 and again.json()["already_deleted"] == [20]

    # The step may be registered again: a new checkpoint, copied and promoted afresh.
    await register(stack, settings, job, 20)
    await until(stack, job, 20, "restorable")
    assert (await stack.get(f"/v1/jobs/{job}/checkpoints/latest")).json()["step"] == 20
    assert len(events(catalog, "deleted", job=job)) == 1


async def test_deleting_a_job_deletes_every_checkpoint_and_keeps_the_job(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2], tiers=("ssd", "lustre", "s3"))
    with catalog.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO restore_lease (checkpoint_id, holder, expires_at) SELECT c.id, 'x', "
                "now() + interval '1 hour' FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = 1"
            ),
            {"job": job},
        )
    refused = await client.delete(f"/v1/jobs/{job}")
    assert refused.status_code == 409 and refused.json()["protected"] == {"1": ["leased"]}
    r = await client.delete(f"/v1/jobs/{job}", params={"force": "true"})
    assert r.status_code == 202, r.text
    assert [d["step"] for d in r.json()["deleted"]] == [1, 2]
    latest = await client.get(f"/v1/jobs/{job}/checkpoints/latest")
    assert latest.status_code == 404 and latest.json()["code"] == "no_restorable_checkpoint"
    (row,) = (await client.get("/v1/overview/jobs", params={"job": job})).json()["items"]
    assert row["latest_step"] is None and row["checkpoints"] == 0
    assert len(events(catalog, "deleted", job=job)) == 2


async def test_deleting_needs_an_admin(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1], tiers=("ssd",))
    operator = as_token(catalog, f"op-{job}", ["operate", "read"])
    r = await client.delete(f"/v1/jobs/{job}/checkpoints/1", headers=operator)
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    assert events(catalog, "deleted", job=job) == []


async def test_registering_a_step_being_deleted_waits_for_its_expiry(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """While the deleted checkpoint's copies are being removed, its step cannot be registered
    again (a new copy would be written where the old one is deleted); once they are expired it
    can, as a new checkpoint that carries the step's history on."""
    await seed(client, catalog, job, [3], tiers=("ssd", "lustre", "s3"))
    assert (await client.delete(f"/v1/jobs/{job}/checkpoints/3")).status_code == 202
    body = manifest(3, [shard("s3/0", size=100), shard("s3/1", size=100)])
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 409 and r.json()["code"] == "checkpoint_being_deleted", r.text

    for tier in ("ssd", "lustre", "s3"):
        set_marker(catalog, job, 3, tier, "expired")
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    fresh = (await client.get(f"/v1/jobs/{job}/checkpoints/3")).json()
    assert fresh["deleted_at"] is None
    assert {t["state"] for t in fresh["tiers"]} == {"pending"}
    # One history per step: the new checkpoint's starts with the old one's, deletion included.
    history = (await client.get(f"/v1/jobs/{job}/checkpoints/3/events")).json()["items"]
    kinds = [e["kind"] for e in history]
    assert kinds[0] == "registered" and "deleted" in kinds and kinds[-1] == "registered", kinds
