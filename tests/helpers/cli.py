"""The CLI run as a user runs it: its own process, against the real API served by uvicorn on a
free local port."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from fastapi import FastAPI

from api.app import create_app
from tests.helpers.services import InProcessServer
from tierpoint.config import Settings


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """The app (lifespan included) served by uvicorn on a free 127.0.0.1 port; yields its URL."""
    server = InProcessServer(app)
    try:
        yield await server.start()
    finally:
        await server.stop()


@pytest.fixture
async def api_url(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[str]:
    async with serving(create_app(settings)) as url:
        yield url


@dataclass
class Result:
    exit_code: int
    output: str  # stdout, and stderr unless it was asked for apart
    stderr: str = ""


async def run_cli(
    api_url: str, *args: str, token: str | None = None, stderr_apart: bool = False
) -> Result:
    """A `tierpoint` command in its own process, as a user runs it, with `token` (else none)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIERPOINT_TOKEN", "TIERPOINT_ACTOR")}
    env |= {"TIERPOINT_API_URL": api_url, "COLUMNS": "200", "NO_COLOR": "1"}
    if token is not None:
        env["TIERPOINT_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "apps.cli.main",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if stderr_apart else asyncio.subprocess.STDOUT,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), (err or b"").decode())


# What /readyz says of a check that took longer than its deadline (api/routers/health.py).
_CHECK_TIMED_OUT = "no answer within"


async def until_ready(run: Callable[[], Awaitable[Result]], attempts: int = 5) -> Result:
    """`run` (a `tierpoint status`), run again (a few times) while the one thing wrong is that
    /readyz's checks ran past their deadline. The API these tests serve runs in the test's own
    process, beside its workers, so a loaded machine can stall its event loop past the checks'
    3 s with nothing down; a check that fails any other way fails at once."""
    for _ in range(attempts - 1):
        r = await run()
        if r.exit_code == 0 or _CHECK_TIMED_OUT not in r.output:
            return r
        await asyncio.sleep(1)
    return await run()


async def run_status(api_url: str, *args: str, token: str) -> Result:
    """`tierpoint status ARGS`, as `until_ready` runs it."""
    return await until_ready(lambda: run_cli(api_url, "status", *args, token=token))
