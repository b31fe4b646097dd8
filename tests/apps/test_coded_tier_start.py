"""A coded peer tier the cluster cannot hold is refused when the shared worker or the API starts,
with what it needs, never run as copies (one it can hold runs: tests/workflows/test_coded_tier.py
starts the project's shared worker with rs(2,1) on four nodes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from apps.worker import run_workers
from tierpoint.catalog.models import Node
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig


def _coded(settings: Settings, code: str, tmp: Any) -> Settings:
    peer = TierConfig(name="stripes", kind="peer", root=f"{tmp}/{{node}}/stripes", code=code)
    return settings.model_copy(
        update={"tiers": [*settings.tiers, peer], "data_token": SecretStr("worker-secret")}
    )


async def _start(settings: Settings, client: Client, nodes: list[str]) -> None:
    # Workers that start run until stopped: the bound turns a refusal that never comes into a
    # failure instead of a hang.
    run = run_workers(settings, client, nodes=nodes, shared=True, stop=asyncio.Event())
    await asyncio.wait_for(run, timeout=300)


async def test_a_code_wider_than_the_cluster_stops_the_shared_worker_at_start(
    settings: Settings, client: Client, tmp_path: Any
) -> None:
    coded = _coded(settings, "rs(4,2)", tmp_path)
    nodes = [f"coded-{i}" for i in range(6)]
    with pytest.raises(ValueError, match=r"needs at least 7 nodes, and the catalog knows 6"):
        await _start(coded, client, nodes)


async def test_the_api_refuses_a_code_wider_than_the_cluster_it_knows(
    settings: Settings, client: Client, sessions: sessionmaker[Session], tmp_path: Any
) -> None:
    # The nodes report in (and the shared worker refuses the code, as above).
    nodes = [f"api-coded-{i}" for i in range(3)]
    with pytest.raises(ValueError, match="needs at least"):
        await _start(_coded(settings, "rs(8,2)", tmp_path), client, nodes)
    with sessions() as s:
        known = s.scalar(select(func.count()).select_from(Node))
    assert known is not None and 0 < known < 11
    app = create_app(_coded(settings, "rs(8,2)", tmp_path))
    with pytest.raises(
        ValueError, match=rf"needs at least 11 nodes, and the catalog knows {known}"
    ):
        async with app.router.lifespan_context(app):
            pass
