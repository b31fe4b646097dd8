"""Worker start-up: schema check, nodes reporting in, metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.conftest import Services, _fresh_database
from tierpoint.catalog.migrate import SchemaMismatch
from tierpoint.catalog.models import Node
from tierpoint.config import Settings
from tierpoint.devstack.services import free_port
from tierpoint.temporal import connect
from tierpoint.worker import node_roots, run_workers

from .conftest import NODES, running_workers


async def test_workers_refuse_an_unmigrated_catalog(services: Services, settings: Settings) -> None:
    empty = settings.model_copy(update={"database_url": _fresh_database(services.database_url)})
    client = await connect(empty)
    with pytest.raises(SchemaMismatch, match="tierpoint migrate"):
        await run_workers(empty, client, nodes=["node-a"], shared=True, stop=asyncio.Event())


async def test_node_workers_report_in_with_their_local_roots(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    def reported() -> dict[str, Node]:
        with sessions() as s:
            return {
                n.id: n
                for n in s.scalars(
                    select(Node).where(Node.id.in_(NODES), Node.last_seen_at > started)
                )
            }

    with sessions() as s:
        started = s.scalar(select(func.now()))
    port = free_port()
    async with running_workers(settings, client, metrics_port=port):
        for _ in range(600):
            rows = reported()
            if len(rows) == len(NODES):
                break
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as http:
            exposed = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert "tierpoint_worker_bytes_copied_total" in exposed
    assert "tierpoint_worker_activity_seconds" in exposed
    assert set(rows) == set(NODES)
    for node in NODES:
        assert rows[node].local_roots == node_roots(settings, node)
        assert rows[node].local_roots["ssd"].endswith(f"{node}/ssd")
        assert rows[node].last_seen_at is not None


def test_metrics_are_registered() -> None:
    from tierpoint import metrics_worker

    metrics_worker.BYTES_COPIED.labels("probe").inc(3)
    assert REGISTRY.get_sample_value("tierpoint_worker_bytes_copied_total", {"tier": "probe"}) == 3
