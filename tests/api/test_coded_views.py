"""The operator views of a coded peer tier (rs(2,1)), through the API on a real catalog: `GET
/v1/tiers` gives the tier's code and its overhead (k+m)/k; a checkpoint's views give its coded
copy's coverage, a stripe found bad showing as a degraded set one stripe short with no margin
left above k; the usage and the jobs overview price the stripe bytes held, (k+m)/k of the files,
not the files once."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from sqlalchemy import Engine

from api.app import create_app
from tests.helpers.api import manifest, restorable, running_client, shard
from tests.helpers.coded_views import PRICE, coded_copy, own_holders, with_coded_tier
from tierpoint.config import Settings

GB = 2**30
SIZES = (GB + 12_345, GB // 7)
# What the helper's copy shows: stripe 0 of the first shard's set found bad.
COVERAGE = {
    "code": "rs(2,1)",
    "sets": 2,
    "whole": 1,
    "degraded": 1,
    "stripes_short": 1,
    "below_k": 0,
    "least_margin": 0,
}


@pytest.fixture
def holders(catalog: Engine) -> Iterator[list[str]]:
    with own_holders(catalog) as names:
        yield names


@pytest.fixture
async def api(
    settings: Settings, nodes: tuple[str, str], holders: list[str]
) -> AsyncIterator[httpx.AsyncClient]:
    async for c in running_client(create_app(with_coded_tier(settings))):
        yield c


async def test_the_views_show_a_coded_tiers_code_coverage_and_the_bytes_it_holds(
    api: httpx.AsyncClient, catalog: Engine, job: str, nodes: tuple[str, str], holders: list[str]
) -> None:
    tiers = {t["name"]: t for t in (await api.get("/v1/tiers")).json()}
    assert tiers["coded"]["code"] == {"code": "rs(2,1)", "k": 2, "m": 1, "overhead": 1.5}
    assert tiers["ssd"]["code"] is None

    body = manifest(1, [shard(f"rank{i}.bin", node=nodes[0], size=n) for i, n in enumerate(SIZES)])
    r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    restorable(catalog, job, 1, "ssd", local=True)
    coded_copy(catalog, job, 1, holders)

    detail = (await api.get(f"/v1/jobs/{job}/checkpoints/1")).json()
    by_tier = {t["tier"]: t for t in detail["tiers"]}
    assert by_tier["coded"]["state"] == "restorable"
    assert by_tier["coded"]["coverage"] == COVERAGE
    assert by_tier["ssd"]["coverage"] is None
    listed = (await api.get(f"/v1/jobs/{job}/checkpoints")).json()["items"]
    assert {t["tier"]: t for t in listed[0]["tiers"]}["coded"]["coverage"] == COVERAGE

    held = math.ceil(sum(SIZES) * 3 / 2)
    usage = {t["tier"]: t for t in (await api.get("/v1/tiers/usage")).json()["items"]}
    coded = usage["coded"]
    mine = next(j for j in coded["jobs"] if j["job"] == job)
    assert mine["bytes"] == sum(SIZES)
    assert coded["code"] == "rs(2,1)" and usage["ssd"]["code"] is None
    assert coded["held_bytes"] == math.ceil(coded["bytes"] * 3 / 2)
    assert coded["monthly_cost"] == pytest.approx(coded["held_bytes"] / GB * PRICE, abs=1e-6)
    assert usage["ssd"]["held_bytes"] == usage["ssd"]["bytes"]

    overview = (await api.get("/v1/overview/jobs", params={"job": job})).json()["items"]
    point = {p["tier"]: p for p in overview[0]["tiers"]}["coded"]
    assert point["bytes"] == sum(SIZES)
    assert point["monthly_cost"] == pytest.approx(held / GB * PRICE, abs=1e-6)
