"""The operator views against a catalog that real lifecycle runs filled: real workers copy real
files through every tier while the views are read. A throttled copy shows its progress advance
between two reads; a checkpoint registered before its file exists shows up as a failure with the
reason; the overview, lag, usage, nodes and event views agree with what happened."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import crc32c
import httpx
import pytest
from temporalio.client import Client

from api.app import create_app
from api.pagination import encode_cursor
from tests.helpers.api import NODE_A, manifest, running_client, shard
from tests.helpers.lifecycle import running_workers, shard_file
from tierpoint.config import Settings

MiB = 1024 * 1024
# A POSIX copy reports progress once per 8 MiB chunk: five chunks, so that two reads can see two
# different values below the total.
SIZE = 40 * MiB
# The copy off the node's ssd reads 4 MiB/s: ~10 s of copy, a progress write every ~2 s.
READ_LIMIT = 4 * MiB
# Guards against a hang, not a performance assertion.
TIMEOUT = 180.0


@pytest.fixture
def throttled(settings: Settings) -> Settings:
    tiers = [
        t.model_copy(update={"read_bandwidth_limit": READ_LIMIT}) if t.name == "ssd" else t
        for t in settings.tiers
    ]
    return settings.model_copy(update={"tiers": tiers})


@pytest.fixture
async def stack(
    throttled: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_workers(throttled, temporal):
        async for c in running_client(create_app(throttled)):
            yield c


def write_shard(settings: Settings, job: str, step: int, path: str, data: bytes) -> dict[str, Any]:
    f = shard_file(settings, "ssd", NODE_A, job, step, path)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    return shard(path, size=len(data), crc=f"{crc32c.crc32c(data):08x}")


async def until(probe: Callable[[], Awaitable[Any]], what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        found = await probe()
        if found:
            return found
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def tier_states(c: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def test_views_follow_a_real_lifecycle(
    stack: httpx.AsyncClient, throttled: Settings, job: str
) -> None:
    data = os.urandom(SIZE)
    r = await stack.post(
        f"/v1/jobs/{job}/checkpoints",
        json=manifest(1, [write_shard(throttled, job, 1, "model.bin", data)]),
    )
    assert r.status_code == 201, r.text

    async def lustre_copy() -> dict[str, Any] | None:
        r = await stack.get("/v1/copies/in-flight", params={"job": job, "tier": "lustre"})
        assert r.status_code == 200, r.text
        items = [i for i in r.json()["items"] if i["bytes_done"] > 0]
        return items[0] if items else None

    first = await until(lustre_copy, "the lustre copy to report progress")
    assert 0 < first["bytes_done"] < SIZE, f"the copy ended before it was seen: slow it ({first})"
    assert first["bytes_total"] == SIZE and first["shards_total"] == 1
    assert first["bytes_per_second"] > 0 and first["eta_seconds"] >= 0

    async def advanced() -> dict[str, Any] | None:
        now = await lustre_copy()
        return now if now is not None and now["bytes_done"] > first["bytes_done"] else None

    second = await until(advanced, "the lustre copy's progress to advance")
    assert second["bytes_done"] > first["bytes_done"]
    # The copy to lustre starts when ssd is promoted, not at registration.
    assert second["started_at"] >= second["created_at"]

    async def done() -> bool:
        return set((await tier_states(stack, job, 1)).values()) == {"restorable"}

    await until(done, "the checkpoint to be restorable on every tier")
    r = await stack.get("/v1/copies/in-flight", params={"job": job})
    assert r.json()["items"] == []

    r = await stack.get("/v1/overview/jobs", params={"prefix": job})
    assert r.status_code == 200, r.text
    [overview] = r.json()["items"]
    assert overview["job"] == job and overview["latest_step"] == 1
    assert (overview["checkpoints"], overview["in_flight"], overview["failed"]) == (1, 0, 0)
    assert [t["tier"] for t in overview["tiers"]] == ["ssd", "lustre", "s3"]
    for t in overview["tiers"]:
        assert t["latest_step"] == 1 and t["steps_behind"] == 0, t
        assert t["bytes"] == SIZE and t["checkpoints"] == 1 and t["age_seconds"] >= 0, t
        assert t["monthly_cost"] > 0
    assert overview["monthly_cost"] == pytest.approx(
        sum(t["monthly_cost"] for t in overview["tiers"]), abs=1e-6
    )

    r = await stack.get("/v1/lag", params={"job": job})
    lag = {i["tier"]: i for i in r.json()["items"]}
    assert set(lag) == {"ssd", "lustre", "s3"}
    for i in lag.values():
        assert i["count"] == 1 and 0 <= i["p50_seconds"] <= i["p95_seconds"] <= i["max_seconds"]
    # Each tier is promoted after the faster one.
    assert lag["ssd"]["max_seconds"] <= lag["lustre"]["max_seconds"] <= lag["s3"]["max_seconds"]

    r = await stack.get("/v1/tiers/usage")
    usage = {t["tier"]: t for t in r.json()["items"]}
    assert {"job": job, "bytes": SIZE, "checkpoints": 1} in usage["lustre"]["jobs"]
    assert usage["lustre"]["free_bytes"] > 0 and usage["lustre"]["capacity_bytes"] > 0
    assert usage["s3"]["free_bytes"] is None

    r = await stack.get("/v1/nodes")
    node = {n["id"]: n for n in r.json()["items"]}[NODE_A]
    assert node["lost_at"] is None and node["last_seen_at"] is not None
    assert node["local_bytes"] >= SIZE and node["local_replicas"] >= 1

    r = await stack.get(f"/v1/jobs/{job}/checkpoints/1/events")
    assert r.status_code == 200, r.text
    kinds = [e["kind"] for e in r.json()["items"]]
    assert kinds[0] == "registered" and kinds.count("promoted") == 3, kinds


async def test_a_missing_file_is_a_failure_with_its_reason(
    stack: httpx.AsyncClient, throttled: Settings, job: str
) -> None:
    for step in (1, 2):
        body = manifest(step, [shard("a.bin", size=5, crc="0badf00d")])
        r = await stack.post(f"/v1/jobs/{job}/checkpoints", json=body)
        assert r.status_code == 201, r.text

    async def both_failed() -> list[dict[str, Any]] | None:
        r = await stack.get("/v1/failures", params={"job": job})
        assert r.status_code == 200, r.text
        items: list[dict[str, Any]] = r.json()["items"]
        return items if {i["step"] for i in items if i["tier"] == "ssd"} == {1, 2} else None

    items = await until(both_failed, "both checkpoints to fail on ssd")
    ssd = [i for i in items if i["tier"] == "ssd"]
    assert all("a.bin" in i["reason"] and "missing" in i["reason"] for i in ssd), ssd
    # Newest first.
    assert [i["failed_at"] for i in items] == sorted((i["failed_at"] for i in items), reverse=True)

    r = await stack.get("/v1/failures", params={"job": job, "limit": 1})
    page = r.json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = (
        await stack.get(
            "/v1/failures", params={"job": job, "limit": 100, "cursor": page["next_cursor"]}
        )
    ).json()
    seen = [(i["step"], i["tier"]) for i in page["items"] + rest["items"]]
    assert sorted(seen) == sorted((i["step"], i["tier"]) for i in items)

    r = await stack.get("/v1/overview/jobs", params={"prefix": job})
    [overview] = r.json()["items"]
    assert overview["failed"] == 2 and overview["latest_step"] == 2
    assert all(t["latest_step"] is None and t["bytes"] == 0 for t in overview["tiers"])


async def test_overview_pages_by_name_and_bad_input_is_refused(
    client: httpx.AsyncClient, job: str
) -> None:
    for name in (f"{job}-a", f"{job}-b", f"{job}-c"):
        r = await client.post(f"/v1/jobs/{name}/checkpoints", json=manifest(7, [shard("x")]))
        assert r.status_code == 201, r.text
    names: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"prefix": f"{job}-", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/overview/jobs", params=params)).json()
        names += [i["job"] for i in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert names == [f"{job}-a", f"{job}-b", f"{job}-c"]

    r = await client.get("/v1/copies/in-flight", params={"tier": "nvme"})
    assert r.status_code == 422 and r.json()["code"] == "unknown_tier"
    for cursor in ("garbage", encode_cursor([1]), encode_cursor(["yesterday", 1, "ssd"])):
        r = await client.get("/v1/failures", params={"cursor": cursor})
        assert r.status_code == 422 and r.json()["code"] == "validation_error", cursor
    r = await client.get("/v1/lag", params={"window_seconds": 1})
    assert r.status_code == 422
    r = await client.get(f"/v1/jobs/{job}-a/checkpoints/8/events")
    assert r.status_code == 404 and r.json()["code"] == "checkpoint_not_found"
