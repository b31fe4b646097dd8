"""`tierpoint quarantine` / `tierpoint unquarantine` in their own process against the real API
served by uvicorn on a free local port."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine

from api.app import create_app
from tests.helpers.api import seed
from tierpoint.config import Settings
from tierpoint.devstack.services import free_port


@pytest.fixture
async def api_url(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[str]:
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


async def _run(api_url: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "TIERPOINT_API_URL": api_url, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tierpoint.cli.main",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def _latest(client: httpx.AsyncClient, job: str, tier: str | None = None) -> int:
    params = {"tier": tier} if tier else {}
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params=params)
    assert r.status_code == 200, r.text
    step: int = r.json()["step"]
    return step


async def test_quarantine_and_unquarantine(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2], tiers=("lustre", "s3"))

    code, out = await _run(api_url, "quarantine", job, "2", "--reason", "NaN after load")
    assert code == 0, out
    assert f"quarantined {job} step 2: NaN after load" in out
    assert await _latest(client, job) == 1

    code, out = await _run(api_url, "unquarantine", job, "2")
    assert code == 0 and f"lifted the quarantine of {job} step 2" in out, out
    assert await _latest(client, job) == 2

    code, out = await _run(api_url, "quarantine", job, "2", "--reason", "bad", "--tier", "lustre")
    assert code == 0 and "quarantined: bad" in out, out
    assert await _latest(client, job, "lustre") == 1
    code, out = await _run(api_url, "unquarantine", job, "2", "--tier", "lustre")
    assert code == 0 and "quarantined: bad" not in out, out
    assert await _latest(client, job, "lustre") == 2

    code, out = await _run(api_url, "quarantine", job, "9", "--reason", "x")
    assert code == 1 and "checkpoint_not_found" in out, out
    code, out = await _run(api_url, "quarantine", job, "2", "--reason", "x", "--tier", "nvme")
    assert code == 1 and "unknown_tier" in out, out
