"""The CLI commands that talk to the API run against the real app: the API tests' fixtures
(tests/helpers/api_fixtures.py), and the app served by uvicorn on a free local port."""

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
import uvicorn

from api.app import create_app
from tests.helpers.api_fixtures import (
    catalog,
    client,
    job,
    new_policy,
    nodes,
    policy_names,
    temporal,
)
from tierpoint.config import Settings
from tierpoint.devstack.services import free_port

__all__ = ["catalog", "client", "job", "new_policy", "nodes", "policy_names", "temporal"]


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
