"""The CLI's views of a coded peer tier, in their own processes against the real API (uvicorn on
a free local port) and a real catalog: `tierpoint show` gives the coded copy's coverage of its
sets (a stripe found bad: one set degraded, one stripe short, no margin left), and `tierpoint
status` the tier's code and the stripe bytes it holds, (k+m)/k of the files."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from sqlalchemy import Engine

from api.app import create_app
from apps.cli.render import human_bytes
from tests.helpers.api import manifest, restorable, running_client, shard
from tests.helpers.cli import run_cli, run_status, serving
from tests.helpers.coded_views import coded_copy, own_holders, with_coded_tier
from tests.helpers.tokens import create_token
from tierpoint.config import Settings

MiB = 1 << 20
TIMEOUT = 120.0  # a guard against a hang, not a performance assertion


@pytest.fixture
def holders(catalog: Engine) -> Iterator[list[str]]:
    with own_holders(catalog) as names:
        yield names


@pytest.fixture
async def stack(
    settings: Settings, nodes: tuple[str, str], holders: list[str]
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    cfg = with_coded_tier(settings)
    async with serving(create_app(cfg)) as url:
        async for c in running_client(create_app(cfg)):
            yield url, c


async def test_show_and_status_give_a_coded_copys_coverage_and_held_bytes(
    stack: tuple[str, httpx.AsyncClient],
    catalog: Engine,
    job: str,
    nodes: tuple[str, str],
    holders: list[str],
) -> None:
    url, api = stack
    body = manifest(1, [shard("a.bin", node=nodes[0], size=4 * MiB), shard("b.bin", size=MiB)])
    assert (await api.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201
    restorable(catalog, job, 1, "ssd", local=True)
    coded_copy(catalog, job, 1, holders)
    token = create_token(catalog, scopes=("read",))

    shown = await asyncio.wait_for(run_cli(url, "show", job, "1", token=token), TIMEOUT)
    assert shown.exit_code == 0, shown.output
    line = next(ln for ln in shown.output.splitlines() if ln.strip("│ ").startswith("coded "))
    assert "rs(2,1) stripes: 1 whole, 1 degraded (1 stripes short), margin 0" in line, line

    status = await asyncio.wait_for(run_status(url, token=token), TIMEOUT)
    assert status.exit_code == 0, status.output
    tier = next(ln for ln in status.output.splitlines() if ln.strip("│ ").startswith("coded "))
    assert "peer rs(2,1)" in tier, tier
    as_json = await asyncio.wait_for(run_status(url, "--json", token=token), TIMEOUT)
    assert as_json.exit_code == 0, as_json.output
    usage = {t["tier"]: t for t in json.loads(as_json.output)["tiers_usage"]["items"]}
    # The stripes held for the coded bytes of every job: 1.5 times as many, both in the table.
    coded = usage["coded"]
    assert coded["held_bytes"] == math.ceil(coded["bytes"] * 3 / 2) > 0, coded
    assert human_bytes(coded["held_bytes"]) in tier and human_bytes(coded["bytes"]) in tier, tier


async def test_show_with_stripes_lists_each_shards_stripes_by_holder_and_state(
    stack: tuple[str, httpx.AsyncClient],
    catalog: Engine,
    job: str,
    nodes: tuple[str, str],
    holders: list[str],
) -> None:
    url, api = stack
    body = manifest(1, [shard("a.bin", node=nodes[0], size=4 * MiB), shard("b.bin", size=MiB)])
    assert (await api.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201
    restorable(catalog, job, 1, "ssd", local=True)
    coded_copy(catalog, job, 1, holders)
    token = create_token(catalog, scopes=("read",))

    shown = await asyncio.wait_for(
        run_cli(url, "show", job, "1", "--stripes", token=token), TIMEOUT
    )
    assert shown.exit_code == 0, shown.output
    rows = {
        cells[0]: cells[2:]
        for ln in shown.output.splitlines()
        if (cells := [c.strip() for c in ln.strip("│ ").split("│")])[0] in ("a.bin", "b.bin")
    }
    # Stripe 0 of a.bin found bad by the scrub: its holder and state say so.
    assert rows["a.bin"] == [
        f"{holders[0]} corrupt",
        f"{holders[1]} verified",
        f"{holders[2]} verified",
    ]
    assert rows["b.bin"] == [f"{h} verified" for h in holders]

    as_json = await asyncio.wait_for(
        run_cli(url, "show", job, "1", "--stripes", "--json", token=token), TIMEOUT
    )
    assert as_json.exit_code == 0, as_json.output
    listed = json.loads(as_json.output)["stripes"]["coded"]
    assert [(s["path"], [x["state"] for x in s["stripes"]]) for s in listed] == [
        ("a.bin", ["corrupt", "verified", "verified"]),
        ("b.bin", ["verified"] * 3),
    ]
