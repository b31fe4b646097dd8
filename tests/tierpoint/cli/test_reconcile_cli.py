"""`tierpoint reconcile` against the real API (uvicorn on a free local port) and real workers: a
report as JSON or a table, and a clear failure for a bad request."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator

import pytest
import uvicorn

from api.app import create_app
from tests.helpers.lifecycle import running_workers
from tests.helpers.services import Services, s3_client
from tierpoint.config import Settings
from tierpoint.devstack.services import free_port
from tierpoint.temporal import connect


@pytest.fixture
async def api_url(settings: Settings) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the API server exited while starting"
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.to_thread(thread.join)


async def _cli(api_url: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "TIERPOINT_API_URL": api_url, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tierpoint.cli.main",
        "reconcile",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_reconcile_cli_reports_and_fails_clearly(
    settings: Settings, services: Services, api_url: str
) -> None:
    client = await connect(settings)
    s3_client(services).put_object(
        Bucket=settings.tier("s3").bucket, Key="stray/1/x.bin", Body=b"x"
    )
    async with running_workers(settings, client, nodes=()):
        code, out = await _cli(api_url, "--tier", "s3", "--json")
        assert code == 0, out
        report = json.loads(out[out.index("{") :])
        (s3,) = report["tiers"]
        assert s3["tier"] == "s3" and s3["counts"] == {"extra": 1}, s3
        assert s3["examples"]["extra"] == ["stray (not a job of the catalog)"]

        code, out = await _cli(api_url, "--tier", "s3")
        assert code == 0, out
        assert "extra 1" in out and "s3 extra: stray (not a job of the catalog)" in out

        code, out = await _cli(api_url, "--tier", "tape")
        assert code == 1, out
        assert "unknown_tier" in out
