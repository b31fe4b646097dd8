from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import NODE_A, NODE_B, manifest, restorable, set_marker, shard


async def _register_steps(client: httpx.AsyncClient, job: str, steps: list[int]) -> None:
    for step in steps:
        r = await client.post(
            f"/v1/jobs/{job}/checkpoints",
            json=manifest(step, [shard("w.bin", NODE_A, step), shard("o.bin", NODE_B, 1)]),
        )
        assert r.status_code == 201, r.text


async def test_get_one_checkpoint(client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    await _register_steps(client, job, [5])
    restorable(catalog, job, 5, "ssd", local=True)
    r = await client.get(f"/v1/jobs/{job}/checkpoints/5")
    assert r.status_code == 200
    body = r.json()
    assert body["step"] == 5 and body["total_bytes"] == 6 and body["shard_count"] == 2
    assert [s["path"] for s in body["shards"]] == ["w.bin", "o.bin"]
    w = body["shards"][0]
    assert (w["size"], w["crc32c"], w["node"]) == (5, "0badf00d", NODE_A)
    assert [(x["tier"], x["node"], x["state"]) for x in w["replicas"]] == [
        ("ssd", NODE_A, "verified")
    ]
    assert w["replicas"][0]["verified_at"] is not None
    ssd = body["tiers"][0]
    assert ssd["state"] == "restorable" and ssd["restorable_at"] is not None
    assert ssd["progress"] == {
        "shards_total": 2,
        "shards_verified": 2,
        "bytes_total": 6,
        "bytes_done": 6,
    }

    slim = (await client.get(f"/v1/jobs/{job}/checkpoints/5", params={"shards": "false"})).json()
    assert slim["shards"] is None and slim["tiers"] == body["tiers"]

    missing = await client.get(f"/v1/jobs/{job}/checkpoints/6")
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"
    bad_step = await client.get(f"/v1/jobs/{job}/checkpoints/-1")
    assert bad_step.status_code == 422 and bad_step.json()["code"] == "validation_error"
    assert bad_step.json()["errors"][0]["field"] == "step"


async def test_list_pages_newest_first(client: httpx.AsyncClient, job: str) -> None:
    steps = [1, 2, 3, 5, 8, 13, 21]
    await _register_steps(client, job, steps)
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = await client.get(f"/v1/jobs/{job}/checkpoints", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        seen += [c["step"] for c in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(steps, reverse=True)
    assert pages == 3

    exact = await client.get(f"/v1/jobs/{job}/checkpoints", params={"limit": 7})
    assert exact.json()["next_cursor"] is None and len(exact.json()["items"]) == 7


async def test_list_filters(client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    await _register_steps(client, job, [1, 2, 3, 4])
    restorable(catalog, job, 1, "lustre")
    restorable(catalog, job, 3, "lustre")
    set_marker(catalog, job, 4, "s3", "failed", reason="bucket gone")
    url = f"/v1/jobs/{job}/checkpoints"

    async def steps(**params: str | int) -> list[int]:
        r = await client.get(url, params=params)
        assert r.status_code == 200, r.text
        return [c["step"] for c in r.json()["items"]]

    assert await steps(tier="lustre", state="restorable") == [3, 1]
    assert await steps(tier="lustre", state="restorable", limit=1) == [3]
    page = (
        await client.get(url, params={"tier": "lustre", "state": "restorable", "limit": 1})
    ).json()
    rest = await client.get(
        url, params={"tier": "lustre", "state": "restorable", "cursor": page["next_cursor"]}
    )
    assert [c["step"] for c in rest.json()["items"]] == [1]
    assert await steps(state="failed") == [4]
    assert await steps(tier="s3", state="pending") == [3, 2, 1]
    assert await steps(tier="ssd") == [4, 3, 2, 1]

    bad_state = await client.get(url, params={"state": "copying"})
    assert bad_state.status_code == 422 and bad_state.json()["code"] == "validation_error"
    bad_tier = await client.get(url, params={"tier": "tape"})
    assert bad_tier.status_code == 422 and bad_tier.json()["code"] == "unknown_tier"
    bad_cursor = await client.get(url, params={"cursor": "not-a-cursor"})
    assert bad_cursor.status_code == 422 and bad_cursor.json()["code"] == "validation_error"
    nojob = await client.get(f"/v1/jobs/{job}-none/checkpoints")
    assert nojob.status_code == 404 and nojob.json()["code"] == "job_not_found"


async def test_jobs_and_tiers(client: httpx.AsyncClient, job: str) -> None:
    await _register_steps(client, job, [4, 9])
    other = job + "-b"
    await _register_steps(client, other, [1])
    names: list[str] = []
    found = {}
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/jobs", params=params)).json()
        names += [j["name"] for j in page["items"]]
        found.update({j["name"]: j for j in page["items"]})
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert names == sorted(names) and len(names) == len(set(names))
    assert found[job]["checkpoint_count"] == 2 and found[job]["latest_step"] == 9
    assert found[other]["checkpoint_count"] == 1

    tiers = (await client.get("/v1/tiers")).json()
    assert [(t["name"], t["kind"]) for t in tiers] == [
        ("ssd", "local"),
        ("lustre", "shared"),
        ("s3", "s3"),
    ]
    assert tiers[0]["root"].endswith("{node}/ssd") and tiers[0]["bucket"] is None
    assert tiers[2]["bucket"] and tiers[2]["root"] is None and tiers[2]["endpoint_url"]
    assert set(tiers[2]) == {
        *("name", "kind", "root", "bucket", "prefix", "endpoint_url", "region"),
        *("credentials_profile", "credentials_env"),
        *("copies", "copy_of", "copy_number", "code"),
    }
    assert (tiers[0]["copies"], tiers[0]["copy_of"], tiers[0]["copy_number"]) == (1, None, None)
    assert tiers[0]["code"] is None


async def test_unknown_route_is_a_problem(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/nothing")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "not_found"
    r = await client.delete("/v1/tiers")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
