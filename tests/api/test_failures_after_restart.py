"""Failures as an operator meets them after a dev stack's restart: its S3 (moto, in memory) forgot
every object, and the start's reconciliation marked the S3 copies lost and asked for repairs.
Real workers copied real files through ssd -> lustre -> s3, real retention expired the older
checkpoints' ssd and lustre copies, and the objects are deleted from the real S3 endpoint.

What the operator then sees through the API: the checkpoint repair copied back is no failure
any more; the two whose only copy was on S3 are, each saying that no retry can help and why
(the same problem a retry answers); a page of one says "1 of 2"; and one request acknowledges
both, by reason, each recorded in its checkpoint's history with the actor and the filter.
Retrying while a repair copies a copy back is refused too, and the failures list says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, events, manifest, running_client, seed, set_marker, shard
from tests.helpers.lifecycle import crc_hex, running_workers, shard_file
from tests.helpers.services import Services, s3_client
from tierpoint.config import Settings

# Guards against a hang, not a performance assertion.
TIMEOUT = 180.0
DATA = b"optimizer state " * 4096
KEEP_ONE_FAST_COPY = {"format": 1, "tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 1}}}


@pytest.fixture
async def stack(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_workers(settings, temporal):
        async for c in running_client(create_app(settings)):
            yield c


async def tiers_of(api: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def until(
    api: httpx.AsyncClient, job: str, step: int, done: Callable[[dict[str, str]], bool]
) -> dict[str, str]:
    async with asyncio.timeout(TIMEOUT):
        while True:
            now = await tiers_of(api, job, step)
            if done(now):
                return now
            await asyncio.sleep(0.2)


async def register(api: httpx.AsyncClient, settings: Settings, job: str, step: int) -> None:
    f = shard_file(settings, "ssd", NODE_A, job, step, "model.bin")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(DATA)
    body = manifest(step, [shard("model.bin", size=len(DATA), crc=crc_hex(DATA))])
    r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    await until(api, job, step, lambda t: set(t.values()) == {"restorable"})


async def restart_forgets_s3(
    api: httpx.AsyncClient, settings: Settings, services: Services
) -> None:
    """What `tierpoint dev` finds at start: every S3 object gone; it reconciles with repair."""
    s3, bucket = s3_client(services), settings.tier("s3").bucket
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=obj["Key"])
    r = await api.post("/v1/reconcile", json={"tier": "s3", "repair": True})
    assert r.status_code == 202, r.text
    async with asyncio.timeout(TIMEOUT):
        while True:
            report = (await api.get(f"/v1/reconcile/{r.json()['id']}")).json()
            if report["status"] != "running":
                break
            await asyncio.sleep(0.2)
    assert report["status"] == "completed", report
    assert sum(t["marked"] for t in report["report"]["tiers"]) == 3, report


async def test_after_a_restart_only_the_lost_checkpoints_fail_and_are_acknowledged_by_reason(
    stack: httpx.AsyncClient, settings: Settings, services: Services, catalog: Engine, job: str
) -> None:
    api = stack
    await register(api, settings, job, 1)
    policy = f"{job}-keep-one"
    r = await api.post("/v1/policies", json={"name": policy, "spec": KEEP_ONE_FAST_COPY})
    assert r.status_code == 201, r.text
    r = await api.put(f"/v1/jobs/{job}/policy", json={"policy": policy})
    assert r.status_code == 200, r.text
    for step in (2, 3):
        await register(api, settings, job, step)
    only_s3 = {"ssd": "expired", "lustre": "expired", "s3": "restorable"}
    for step in (1, 2):
        await until(api, job, step, lambda t: t == only_s3)

    await restart_forgets_s3(api, settings, services)
    # Repair copies step 3 back from lustre: no failure then. Steps 1 and 2 had no other copy.
    await until(api, job, 3, lambda t: t["s3"] == "restorable")
    for step in (1, 2):
        assert await tiers_of(api, job, step) == {**only_s3, "s3": "failed"}

    page = (await api.get("/v1/failures", params={"job": job})).json()
    assert page["total"] == 2 and [f["step"] for f in page["items"]] == [2, 1], page
    for f in page["items"]:
        assert f["tier"] == "s3" and "lost on s3 (found by reconcile)" in f["reason"], f
        # The replica's error ("reconcile: missing on s3") is in the reason already: once.
        assert f["last_error"] is None, f
        assert f["retryable"] is False, f
        refused = f["retry_refused"]
        assert refused["code"] == "no_verified_source", f
        assert "ssd is expired, lustre is expired" in refused["detail"], f
        # In a few words, without the failure's own reason (the list shows that already).
        assert refused["why"] == (
            "the copies a new run would start from are gone (ssd is expired, lustre is expired)"
        ), f
        # The retry the list advises against answers exactly that, and changes nothing.
        r = await api.post(f"/v1/jobs/{job}/checkpoints/{f['step']}/retry")
        assert r.status_code == 409 and r.json()["code"] == refused["code"], r.text
        assert r.json()["detail"] == refused["detail"]
    one = (await api.get("/v1/failures", params={"job": job, "limit": 1})).json()
    assert (len(one["items"]), one["total"]) == (1, 2) and one["next_cursor"], one

    # Bad requests change nothing.
    r = await api.post("/v1/failures/acknowledge", json={})
    assert r.status_code == 422 and r.json()["code"] == "filter_required", r.text
    r = await api.post("/v1/failures/acknowledge", json={"reason": "lost", "tier": "tape"})
    assert r.status_code == 422 and r.json()["code"] == "unknown_tier", r.text
    r = await api.post("/v1/failures/acknowledge", json={"job": job, "reason": "corrupt on s3"})
    assert r.status_code == 409 and r.json()["code"] == "nothing_to_acknowledge", r.text
    assert (await api.get("/v1/failures", params={"job": job})).json()["total"] == 2

    # One request for both, by reason (any case), as of the list the operator looked at.
    r = await api.post(
        "/v1/failures/acknowledge",
        json={"reason": "LOST ON S3 (found by reconcile)", "job": job, "until": page["now"]},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["acknowledged"] == 2, out
    assert sorted((a["step"], a["tier"]) for a in out["items"]) == [(1, "s3"), (2, "s3")]
    after = (await api.get("/v1/failures", params={"job": job})).json()
    assert (after["total"], after["items"]) == (0, []), after
    overview = (await api.get("/v1/overview/jobs", params={"job": job})).json()
    assert overview["items"][0]["failed"] == 0 and overview["total"] == 1, overview
    acked = events(catalog, "acknowledged", job=job)
    assert len(acked) == 2 and all(e["actor"] for e in acked), acked
    assert all(
        e["detail"]["acknowledged_by"] == {"job": job, "reason": "LOST ON S3 (found by reconcile)"}
        for e in acked
    ), acked


async def test_a_retry_while_a_repair_copies_the_copy_back_is_refused_and_said(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [7], tiers=("ssd", "lustre"))
    set_marker(catalog, job, 7, "s3", "failed", reason="1 shard(s) lost on s3 (found by scrub)")
    hold(catalog, job, 7, "s3", ["lustre"])

    [f] = (await client.get("/v1/failures", params={"job": job})).json()["items"]
    assert f["retryable"] is False and f["retry_refused"]["code"] == "repair_in_progress", f
    assert "s3 from lustre" in f["retry_refused"]["detail"], f
    r = await client.post(f"/v1/jobs/{job}/checkpoints/7/retry")
    assert r.status_code == 409 and r.json()["code"] == "repair_in_progress", r.text
    assert events(catalog, "operator_action", job=job) == []


def hold(catalog: Engine, job: str, step: int, tier: str, sources: list[str]) -> None:
    """What a repair's plan records while it copies the tier's copy back (holds/rebuild.py)."""
    with catalog.begin() as conn:
        conn.execute(
            text(
                "UPDATE checkpoint_tier ct SET rebuild_from = CAST(:src AS jsonb), "
                "rebuild_until = now() + interval '1 hour' FROM checkpoint c JOIN job j "
                "ON j.id = c.job_id WHERE ct.checkpoint_id = c.id AND j.name = :job "
                "AND c.step = :step AND ct.tier = :tier"
            ),
            {"src": json.dumps(sources), "job": job, "step": step, "tier": tier},
        )
