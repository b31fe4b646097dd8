"""`tierpoint reconcile` against the real API (uvicorn on a free local port) and real workers: a
report as JSON or a table, and a clear failure for a bad request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from api.app import create_app
from apps.cli.reconcile import unchecked_tiers
from tests.helpers.cli import run_cli, serving
from tests.helpers.lifecycle import running_workers
from tests.helpers.services import Services, s3_client
from tests.helpers.tokens import create_token
from tierpoint.config import Settings
from tierpoint.temporal import connect


@pytest.fixture
async def api_url(settings: Settings) -> AsyncIterator[str]:
    async with serving(create_app(settings)) as url:
        yield url


async def _cli(api_url: str, token: str, *args: str) -> tuple[int, str]:
    r = await asyncio.wait_for(run_cli(api_url, "reconcile", *args, token=token), 300)
    return r.exit_code, r.output


async def test_reconcile_cli_reports_and_fails_clearly(
    settings: Settings, services: Services, api_url: str
) -> None:
    client = await connect(settings)
    operator = create_token(settings.database_url, scopes=["operate", "read"])
    s3_client(services).put_object(
        Bucket=settings.tier("s3").bucket, Key="stray/1/x.bin", Body=b"x"
    )
    async with running_workers(settings, client, nodes=()):
        code, out = await _cli(api_url, operator, "--tier", "s3", "--json")
        assert code == 0, out
        report = json.loads(out[out.index("{") :])
        (s3,) = report["tiers"]
        assert s3["tier"] == "s3" and s3["counts"] == {"extra": 1}, s3
        assert s3["examples"]["extra"] == ["stray (not a job of the catalog)"]
        # The same report with the tier's scan failed (an outage outlasting its retries) is no
        # all-clear: the command exits 1 naming the tier.
        assert unchecked_tiers(report) == []
        assert unchecked_tiers({"tiers": [{**s3, "error": "NoSuchBucket"}]}) == ["s3"]

        code, out = await _cli(api_url, operator, "--tier", "s3")
        assert code == 0, out
        assert "extra 1" in out and "s3 extra: stray (not a job of the catalog)" in out

        code, out = await _cli(api_url, operator, "--tier", "tape")
        assert code == 1, out
        assert "unknown_tier" in out
