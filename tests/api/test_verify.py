"""Verify, end to end: an operator asks the server to read a checkpoint's copy on one tier back.
A good copy reads good and nothing changes; a byte changed behind tierpoint's back on the shared
tier is found, the replica marked corrupt and the tier demoted in the same transaction, and the
repair started by the verification copies it back. Asking again while a run is going joins it;
bad requests are clear problems that change nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import crc32c
import httpx
import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, events, manifest, running_client, shard
from tests.helpers.lifecycle import record_history, recording_histories, running_workers, shard_file
from tierpoint.config import Settings
from tierpoint.contract.integrity import verify_checkpoint_workflow_id

A = b"layer weights " * 5000
B = b"optimizer state " * 3000
# Guards against a hang, not a performance assertion.
TIMEOUT = 120.0


@pytest.fixture
async def stack(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_workers(settings, temporal):
        async for c in running_client(create_app(settings)):
            yield c


async def tiers(c: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def until(c: httpx.AsyncClient, job: str, step: int, want: dict[str, str]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while True:
            if await tiers(c, job, step) == want:
                return
            await asyncio.sleep(0.2)


async def restorable_checkpoint(
    c: httpx.AsyncClient, settings: Settings, job: str, step: int
) -> None:
    for path, data in (("a.bin", A), ("b.bin", B)):
        f = shard_file(settings, "ssd", NODE_A, job, step, path)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    shards = [
        shard(p, size=len(d), crc=f"{crc32c.crc32c(d):08x}")
        for p, d in (("a.bin", A), ("b.bin", B))
    ]
    r = await c.post(f"/v1/jobs/{job}/checkpoints", json=manifest(step, shards))
    assert r.status_code == 201, r.text
    await until(c, job, step, {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"})


async def verify(c: httpx.AsyncClient, job: str, step: int, tier: str) -> dict[str, object]:
    """The answer once the run completed (a slow machine may answer `running` first: asking
    again joins the same run)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            r = await c.post(f"/v1/jobs/{job}/checkpoints/{step}/verify", json={"tier": tier})
            assert r.status_code == 202, r.text
            body: dict[str, object] = r.json()
            if body["status"] != "running":
                return body


async def test_verify_finds_a_changed_byte_and_the_repair_follows(
    settings: Settings, catalog: Engine, temporal: Client, nodes: tuple[str, str], job: str
) -> None:
    all_good = {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}
    async for c in running_client(create_app(settings)):
        async with running_workers(settings, temporal):
            await restorable_checkpoint(c, settings, job, 1)
            good = await verify(c, job, 1, "lustre")
            assert good["status"] == "completed", good
            assert good["workflow_id"] == verify_checkpoint_workflow_id(job, 1, "lustre")
            outcome = good["outcome"]
            assert isinstance(outcome, dict)
            assert (outcome["read"], outcome["good"], outcome["corrupt"]) == (2, 2, 0), outcome
            assert outcome["lost"] == 0 and outcome["repair_requested"] is False
            assert await tiers(c, job, 1) == all_good
            assert events(catalog, "corrupt", job=job) == []
            if recording_histories():
                await record_history(temporal, str(good["workflow_id"]), "verify_checkpoint")

        lustre = shard_file(settings, "lustre", None, job, 1, "a.bin")
        data = bytearray(lustre.read_bytes())
        data[4321] ^= 0x08
        lustre.write_bytes(bytes(data))

        # Only the shared worker: the verification reads lustre, and the repair it asks for
        # (from the node's ssd, on the node's queue) waits, so the damage stays visible.
        async with running_workers(settings, temporal, nodes=()):
            bad = await verify(c, job, 1, "lustre")
            outcome = bad["outcome"]
            assert isinstance(outcome, dict)
            assert (outcome["read"], outcome["good"], outcome["corrupt"]) == (2, 1, 1), outcome
            assert outcome["repair_requested"] is True
            assert "a.bin" in str(outcome["problems"])
            # Marked and demoted in one transaction: latest restorable stops offering lustre.
            assert await tiers(c, job, 1) == {**all_good, "lustre": "failed"}
            r = await c.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "lustre"})
            assert r.status_code == 404 and r.json()["code"] == "no_restorable_checkpoint"
            (corrupt,) = events(catalog, "corrupt", job=job)
            assert corrupt["detail"]["marker_demoted"] is True and corrupt["actor"] == "verify"

        # Node workers come: the repair copies the good bytes back and lustre is promoted again.
        async with running_workers(settings, temporal):
            await until(c, job, 1, all_good)
            assert lustre.read_bytes() == A
            r = await c.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "lustre"})
            assert r.status_code == 200 and r.json()["step"] == 1, r.text
            actions = events(catalog, "operator_action", job=job)
            assert [e["detail"]["action"] for e in actions] == ["verify", "verify"]
            assert all(e["actor"] for e in actions)
            # Read again after the repair: good, nothing changes.
            again = await verify(c, job, 1, "lustre")
            assert again["outcome"]["corrupt"] == 0  # type: ignore[index]
            assert len(events(catalog, "corrupt", job=job)) == 1
            assert await tiers(c, job, 1) == all_good


async def test_verify_joins_a_running_verification(
    stack: httpx.AsyncClient, settings: Settings, catalog: Engine, job: str
) -> None:
    await restorable_checkpoint(stack, settings, job, 2)
    url = f"/v1/jobs/{job}/checkpoints/2/verify"
    first, second = await asyncio.gather(
        stack.post(url, json={"tier": "s3"}), stack.post(url, json={"tier": "s3"})
    )
    assert first.status_code == second.status_code == 202, (first.text, second.text)
    answers = [first.json(), second.json()]
    started = [a for a in answers if not a["joined"]]
    # Either both asked while one run was going (one started, one joined) or the first had
    # finished before the second asked (two runs): never two runs at once.
    assert started, answers
    if len(started) == 1:
        assert answers[0]["run_id"] == answers[1]["run_id"]
        assert len(events(catalog, "operator_action", job=job)) == 1
    for a in answers:
        if a["status"] == "completed":
            assert a["outcome"]["good"] == 2, a


async def test_verify_refuses_bad_requests(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    r = await client.post(f"/v1/jobs/{job}/checkpoints/1/verify", json={"tier": "ssd"})
    assert r.status_code == 404 and r.json()["code"] == "job_not_found", r.text
    r = await client.post(f"/v1/jobs/{job}/checkpoints/1/verify", json={"tier": "tape"})
    assert r.status_code == 422 and r.json()["code"] == "unknown_tier", r.text
    r = await client.post(f"/v1/jobs/{job}/checkpoints/1/verify", json={})
    assert r.status_code == 422, r.text
    body = manifest(1, [shard("a.bin", size=10, crc="0badf00d")])
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    r = await client.post(f"/v1/jobs/{job}/checkpoints/2/verify", json={"tier": "ssd"})
    assert r.status_code == 404 and r.json()["code"] == "checkpoint_not_found", r.text
    # Registered, nothing copied yet (no workers here): no verified replica to read.
    r = await client.post(f"/v1/jobs/{job}/checkpoints/1/verify", json={"tier": "lustre"})
    assert r.status_code == 409 and r.json()["code"] == "nothing_to_verify", r.text
    assert events(catalog, "operator_action", job=job) == []
