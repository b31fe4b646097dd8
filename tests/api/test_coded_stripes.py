"""A checkpoint's coded copy stripe by stripe, through the API on a real catalog (rs(2,1)):
`GET .../checkpoints/{step}/tiers/{tier}/stripes` pages the shards in manifest order, each with
its stripes by index (holder, state, size, crc32c); a stripe found bad shows `corrupt`, one on a
holder declared lost says so. A bad cursor or limit, a tier that is not configured or keeps
whole copies, and a step with no checkpoint are problems, and nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from sqlalchemy import Engine, func, update
from sqlalchemy.orm import Session

from api.app import create_app
from tests.helpers.api import manifest, running_client, shard
from tests.helpers.coded_views import coded_copy, own_holders, with_coded_tier
from tierpoint.catalog.models import Node
from tierpoint.config import Settings

PATHS = ("rank0.bin", "rank1.bin", "rank2.bin")


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


async def _registered(api: httpx.AsyncClient, job: str, node: str) -> None:
    body = manifest(1, [shard(p, node=node, size=1000 + i) for i, p in enumerate(PATHS)])
    r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text


async def test_the_stripes_of_each_shard_with_holder_and_state_page_by_page(
    api: httpx.AsyncClient, catalog: Engine, job: str, nodes: tuple[str, str], holders: list[str]
) -> None:
    await _registered(api, job, nodes[0])
    url = f"/v1/jobs/{job}/checkpoints/1/tiers/coded/stripes"
    # Registered, nothing cut yet: every shard, no stripes.
    before = (await api.get(url)).json()
    assert [(s["path"], s["code"], s["stripes"]) for s in before["items"]] == [
        (p, None, []) for p in PATHS
    ]
    coded_copy(catalog, job, 1, holders)
    with Session(catalog) as s, s.begin():
        s.execute(update(Node).where(Node.id == holders[2]).values(lost_at=func.now()))

    first = await api.get(url, params={"limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    assert [s["path"] for s in page["items"]] == list(PATHS[:2])
    assert page["next_cursor"] is not None
    rest = (await api.get(url, params={"limit": 2, "cursor": page["next_cursor"]})).json()
    assert [s["path"] for s in rest["items"]] == [PATHS[2]] and rest["next_cursor"] is None

    shards = [*page["items"], *rest["items"]]
    for n, sh in enumerate(shards):
        assert sh["code"] == "rs(2,1)" and sh["node"] == nodes[0] and sh["size"] == 1000 + n
        got = [(s["index"], s["node"], s["state"], s["holder_lost"]) for s in sh["stripes"]]
        # Stripe 0 of the first shard found bad by a scrub; the parity stripes' holder lost.
        assert got == [
            (0, holders[0], "corrupt" if n == 0 else "verified", False),
            (1, holders[1], "verified", False),
            (2, holders[2], "verified", True),
        ], sh
        assert [(s["size"], s["crc32c"]) for s in sh["stripes"]] == [
            (10 + i, f"{i:08x}") for i in range(3)
        ]
    assert shards[0]["stripes"][0]["error"] == "scrub: crc32c differs"


@pytest.mark.parametrize(
    ("tier", "params", "status", "code"),
    [
        ("coded", {"cursor": "not-ours"}, 422, "validation_error"),
        ("coded", {"limit": 0}, 422, "validation_error"),
        ("coded", {"limit": 501}, 422, "validation_error"),
        ("nowhere", {}, 422, "unknown_tier"),
        ("ssd", {}, 422, "tier_not_coded"),
    ],
)
async def test_a_bad_request_is_a_problem(
    api: httpx.AsyncClient,
    job: str,
    nodes: tuple[str, str],
    tier: str,
    params: dict[str, str | int],
    status: int,
    code: str,
) -> None:
    await _registered(api, job, nodes[0])
    r = await api.get(f"/v1/jobs/{job}/checkpoints/1/tiers/{tier}/stripes", params=params)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == code, r.text


async def test_no_checkpoint_at_the_step_is_not_found(
    api: httpx.AsyncClient, job: str, nodes: tuple[str, str]
) -> None:
    await _registered(api, job, nodes[0])
    r = await api.get(f"/v1/jobs/{job}/checkpoints/2/tiers/coded/stripes")
    assert r.status_code == 404 and r.json()["code"] == "checkpoint_not_found", r.text
    r = await api.get("/v1/jobs/no-such-job/checkpoints/1/tiers/coded/stripes")
    assert r.status_code == 404 and r.json()["code"] == "job_not_found", r.text
