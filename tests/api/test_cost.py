"""Monthly cost in the usage and dry-run answers equals a hand computation from the catalog's
bytes and the configured prices; a tighter previewed policy shows a negative cost delta."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy import Engine

from api.app import create_app
from tests.helpers.api import manifest, restorable, running_client, shard
from tierpoint.config import Settings

GB = 2**30
# Prices of our own choosing, distinct per tier so that a mix-up shows.
PRICES = {"ssd": 0.5, "lustre": 0.25, "s3": 0.125}
# Two shards per checkpoint, of sizes no price rounds nicely.
SIZES = (3 * GB + 7_654_321, GB // 3)
CHECKPOINT = sum(SIZES)
POLICY = {"tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 2}}}
TIGHTER = {"tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 1}, "s3": {"keep_last": 2}}}


@pytest.fixture
async def priced(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    tiers = [t.model_copy(update={"price_per_gb_month": PRICES[t.name]}) for t in settings.tiers]
    async for c in running_client(create_app(settings.model_copy(update={"tiers": tiers}))):
        yield c


async def _seed(client: httpx.AsyncClient, catalog: Engine, job: str, name: str) -> None:
    for step in (1, 2, 3, 4):
        shards = [shard(f"s{step}/{i}", size=size) for i, size in enumerate(SIZES)]
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(step, shards))
        assert r.status_code == 201, r.text
        for tier in PRICES:
            restorable(catalog, job, step, tier, local=tier == "ssd")
    r = await client.post("/v1/policies", json={"name": name, "spec": POLICY})
    assert r.status_code == 201, r.text
    r = await client.put(f"/v1/jobs/{job}/policy", json={"policy": name})
    assert r.status_code == 200, r.text


def dollars(tier: str, checkpoints: int) -> float:
    return checkpoints * CHECKPOINT / GB * PRICES[tier]


async def test_usage_cost_is_bytes_times_price(
    priced: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    await _seed(priced, catalog, job, new_policy())
    r = await priced.get(f"/v1/jobs/{job}/usage")
    assert r.status_code == 200, r.text
    body = r.json()
    # Four checkpoints everywhere now; the policy keeps 1 on ssd, 2 on lustre, all on s3.
    after = {"ssd": 1, "lustre": 2, "s3": 4}
    for t in body["tiers"]:
        assert t["bytes_now"] == 4 * CHECKPOINT
        assert t["price_per_gb_month"] == PRICES[t["tier"]]
        assert t["monthly_cost_now"] == pytest.approx(dollars(t["tier"], 4), abs=1e-6)
        assert t["monthly_cost_after"] == pytest.approx(
            dollars(t["tier"], after[t["tier"]]), abs=1e-6
        )
    assert body["currency"] == "USD"
    assert body["monthly_cost_now"] == pytest.approx(sum(dollars(t, 4) for t in PRICES), abs=1e-5)
    assert body["monthly_cost_after"] == pytest.approx(
        sum(dollars(t, n) for t, n in after.items()), abs=1e-5
    )


async def test_a_tighter_preview_costs_less_and_says_by_how_much(
    priced: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    await _seed(priced, catalog, job, new_policy())
    current = (await priced.post(f"/v1/jobs/{job}/retention/plan")).json()
    assert current["compared_to_current"] is None
    assert current["cost"]["monthly_cost_after"] == pytest.approx(
        dollars("ssd", 1) + dollars("lustre", 2) + dollars("s3", 4), abs=1e-5
    )

    r = await priced.post(f"/v1/jobs/{job}/retention/plan", json={"policy": TIGHTER})
    assert r.status_code == 200, r.text
    body = r.json()
    expected_after = dollars("ssd", 1) + dollars("lustre", 1) + dollars("s3", 2)
    assert body["cost"]["monthly_cost_after"] == pytest.approx(expected_after, abs=1e-5)
    compared = body["compared_to_current"]
    assert compared["current_policy_monthly_cost_after"] == current["cost"]["monthly_cost_after"]
    # One lustre and two s3 checkpoints fewer.
    delta = -(dollars("lustre", 1) + dollars("s3", 2))
    assert compared["monthly_cost_delta"] == pytest.approx(delta, abs=1e-5)
    assert compared["monthly_cost_delta"] < 0

    same = (await priced.post(f"/v1/jobs/{job}/retention/plan", json={"policy": POLICY})).json()
    assert same["compared_to_current"]["monthly_cost_delta"] == 0


async def test_default_prices_apply_when_none_are_configured(
    client: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    await _seed(client, catalog, job, new_policy())
    body = (await client.get(f"/v1/jobs/{job}/usage")).json()
    # The test stack's tiers: node-local, shared and S3 STANDARD (docs/cost.md's defaults).
    assert {t["tier"]: t["price_per_gb_month"] for t in body["tiers"]} == {
        "ssd": 0.08,
        "lustre": 0.145,
        "s3": 0.023,
    }
