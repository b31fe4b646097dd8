"""`tierpoint usage JOB` and the cost lines of `tierpoint policy plan`, as processes against the
real API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import Engine

from tests.helpers.api import seed
from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token


async def test_usage_shows_bytes_and_monthly_cost_per_tier(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2])
    reader = create_token(catalog, scopes=["read"])
    r = await run_cli(api_url, "usage", job, "--json", token=reader)
    assert r.exit_code == 0, r.output
    body = json.loads(r.output)
    assert {t["tier"] for t in body["tiers"]} == {"ssd", "lustre", "s3"}
    assert all("monthly_cost_now" in t for t in body["tiers"])

    r = await run_cli(api_url, "usage", job, token=reader)
    assert r.exit_code == 0, r.output
    for text in ("$/month now", "$/month after", "total", "ssd", "lustre", "s3"):
        assert text in r.output, r.output

    r = await run_cli(api_url, "usage", "no-such-job", token=reader)
    assert r.exit_code == 1 and "job_not_found" in r.output, r.output


async def test_plan_with_a_preview_prints_the_cost_delta(
    api_url: str,
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    new_policy: Callable[[], str],
    tmp_path: Path,
) -> None:
    await seed(client, catalog, job, [1, 2, 3])
    reader = create_token(catalog, scopes=["read"])
    r = await run_cli(api_url, "policy", "plan", job, token=reader)
    assert r.exit_code == 0 and "monthly cost:" in r.output, r.output
    assert "against the job's own policy" not in r.output
    preview = tmp_path / "tight.json"
    preview.write_text(json.dumps({"kinds": {"s3": {"keep_last": 1}}}))
    r = await run_cli(api_url, "policy", "plan", job, "--policy", str(preview), token=reader)
    assert r.exit_code == 0, r.output
    assert "against the job's own policy" in r.output and "a month" in r.output
