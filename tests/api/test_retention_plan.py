"""The dry run and usage endpoints against seeded catalog rows: the answer is the planner's plan
on the same snapshot, names the rules, and never expires a pinned or leased checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.helpers.api import SHARD_BYTES, row_counts, seed
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.config import Settings
from tierpoint.retention import Policy, RetentionPlan, plan, tier_refs

POLICY = {"tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 2}}}
CHECKPOINT_BYTES = 2 * SHARD_BYTES


def _expiries(body: dict[str, Any]) -> set[tuple[str, int]]:
    return {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}


async def _assign(client: httpx.AsyncClient, job: str, name: str, spec: dict[str, Any]) -> None:
    r = await client.post("/v1/policies", json={"name": name, "spec": spec})
    assert r.status_code == 201, r.text
    r = await client.put(f"/v1/jobs/{job}/policy", json={"policy": name})
    assert r.status_code == 200, r.text


async def test_dry_run_is_the_planners_plan_and_names_rules(
    client: httpx.AsyncClient,
    catalog: Engine,
    settings: Settings,
    job: str,
    new_policy: Callable[[], str],
) -> None:
    await seed(client, catalog, job, [1, 2, 3, 4])
    name = new_policy()
    await _assign(client, job, name, POLICY)

    before = row_counts(catalog)
    r = await client.post(f"/v1/jobs/{job}/retention/plan")
    assert r.status_code == 200, r.text
    body = r.json()
    assert row_counts(catalog) == before
    assert body["policy"] | {"spec": None} == {
        "source": "job",
        "name": name,
        "version": 1,
        "spec": None,
    }
    assert _expiries(body) == {("ssd", 1), ("ssd", 2), ("ssd", 3), ("lustre", 1), ("lustre", 2)}
    for e in body["plan"]["expiries"]:
        assert e["rule"] == "not_kept" and "keep_last" in e["reason"]
        assert e["bytes"] == CHECKPOINT_BYTES
    keeps = {(k["tier"], k["step"]): k["reasons"] for k in body["plan"]["keeps"]}
    assert "keep_last" in keeps[("ssd", 4)] and "keep_all" in keeps[("s3", 1)]
    assert "latest_durable" in keeps[("s3", 4)]

    # Exactly what the planner says on the same catalog rows at the same time.
    now = datetime.fromisoformat(body["plan"]["now"])
    with Session(catalog) as s:
        expected = plan(
            take_snapshot(s, job, tier_refs(settings.tiers), now), Policy.from_spec(POLICY), now
        )
    assert RetentionPlan.model_validate(body["plan"]) == expected
    assert body["plan"] == expected.model_dump(mode="json")


async def test_pinned_and_leased_checkpoints_never_expire(
    client: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    await seed(client, catalog, job, [1, 2, 3, 4])
    await _assign(client, job, new_policy(), POLICY)

    pin = await client.put(f"/v1/jobs/{job}/checkpoints/2/pin")
    assert pin.status_code == 200 and pin.json()["pinned"] and pin.json()["changed"]
    lease = await client.post(f"/v1/jobs/{job}/checkpoints/1/leases", json={"ttl_seconds": 600})
    assert lease.status_code == 201, lease.text

    body = (await client.post(f"/v1/jobs/{job}/retention/plan")).json()
    assert _expiries(body) == {("ssd", 3)}
    keeps = {(k["tier"], k["step"]): k["reasons"] for k in body["plan"]["keeps"]}
    for tier in ("ssd", "lustre", "s3"):
        assert "pinned" in keeps[(tier, 2)] and "leased" in keeps[(tier, 1)]

    usage = (await client.get(f"/v1/jobs/{job}/usage")).json()
    ssd = next(t for t in usage["tiers"] if t["tier"] == "ssd")
    assert (ssd["bytes_now"], ssd["bytes_after"]) == (4 * CHECKPOINT_BYTES, 3 * CHECKPOINT_BYTES)
    assert (ssd["checkpoints_now"], ssd["checkpoints_after"], ssd["expiring"]) == (4, 3, 1)

    # Released and unpinned: the policy decides again.
    lease_id = lease.json()["id"]
    done = await client.delete(f"/v1/jobs/{job}/checkpoints/1/leases/{lease_id}")
    assert done.status_code == 204
    unpin = await client.delete(f"/v1/jobs/{job}/checkpoints/2/pin")
    assert unpin.status_code == 200 and not unpin.json()["pinned"]
    body = (await client.post(f"/v1/jobs/{job}/retention/plan")).json()
    assert _expiries(body) == {("ssd", 1), ("ssd", 2), ("ssd", 3), ("lustre", 1), ("lustre", 2)}


async def test_usage_now_and_after(
    client: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    await seed(client, catalog, job, [10, 20, 30], tiers=("ssd", "lustre", "s3"))
    await seed(client, catalog, job, [40], tiers=("ssd",))
    await _assign(client, job, new_policy(), POLICY)
    r = await client.get(f"/v1/jobs/{job}/usage")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["policy"]["source"] == "job"
    got = {
        t["tier"]: (t["bytes_now"], t["bytes_after"], t["checkpoints_now"], t["checkpoints_after"])
        for t in body["tiers"]
    }
    c = CHECKPOINT_BYTES
    assert got == {
        # 40 stays (keep_last=1); 30 is the newest on s3 and local copies of 10/20/30 are safe.
        "ssd": (4 * c, c, 4, 1),
        "lustre": (3 * c, 2 * c, 3, 2),
        "s3": (3 * c, 3 * c, 3, 3),
    }


async def test_preview_a_policy_without_storing_it(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2, 3])
    before = row_counts(catalog)
    r = await client.post(
        f"/v1/jobs/{job}/retention/plan",
        json={
            "policy": {
                "kinds": {"local": {"keep_last": 2}, "shared": {"max_bytes": CHECKPOINT_BYTES}}
            }
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["policy"]["source"] == "preview" and body["policy"]["name"] is None
    assert _expiries(body) == {("ssd", 1), ("lustre", 1), ("lustre", 2)}
    rules = {(e["tier"], e["step"]): e["rule"] for e in body["plan"]["expiries"]}
    assert rules[("lustre", 1)] == "max_bytes" and rules[("ssd", 1)] == "not_kept"

    bad = await client.post(
        f"/v1/jobs/{job}/retention/plan", json={"policy": {"tiers": {"nvme": {"keep_last": 1}}}}
    )
    assert bad.status_code == 422 and bad.json()["code"] == "unknown_tier"
    assert bad.json()["errors"][0]["loc"] == ["policy", "tiers", "nvme"]
    assert row_counts(catalog) == before

    unknown = await client.post("/v1/jobs/rjob-no-such-job-x/retention/plan")
    assert unknown.status_code == 404 and unknown.json()["code"] == "job_not_found"
    assert (await client.get("/v1/jobs/rjob-no-such-job-x/usage")).status_code == 404
