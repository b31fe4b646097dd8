"""A coded peer tier the cluster cannot hold is refused when the shared worker starts, with what
it needs; one it can hold is refused for what this version cannot do yet, never run as copies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.client import Client

from apps.worker import run_workers
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


async def test_a_placeable_code_is_refused_rather_than_copied_whole(
    settings: Settings, client: Client, tmp_path: Any
) -> None:
    coded = _coded(settings, "rs(2,1)", tmp_path)
    nodes = [f"coded-{i}" for i in range(4)]
    with pytest.raises(ValueError, match=r"does not copy them to their holders yet"):
        await _start(coded, client, nodes)
