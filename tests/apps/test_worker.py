"""Worker start-up: schema check, nodes reporting in, metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from apps.devstack.services import free_port
from apps.worker import WORKER_CONNECTIONS, catalog_engine, node_roots, run_workers
from apps.worker_threads import shielded
from tests.helpers.lifecycle import NODES, new_job, random_shards, running_workers, seed_checkpoint
from tests.helpers.services import Services, fresh_database
from tierpoint.catalog.migrate import SchemaMismatch
from tierpoint.catalog.models import Node, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.states import ReplicaState
from tierpoint.temporal import connect, start_lifecycle


async def test_workers_refuse_an_unmigrated_catalog(services: Services, settings: Settings) -> None:
    empty = settings.model_copy(update={"database_url": fresh_database(services.database_url)})
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
    assert shielded()  # threads the activities start survive the SDK's cancellation
    assert "tierpoint_worker_bytes_copied_total" in exposed
    assert "tierpoint_worker_activity_seconds" in exposed
    assert set(rows) == set(NODES)
    for node in NODES:
        assert rows[node].local_roots == node_roots(settings, node)
        assert rows[node].local_roots["ssd"].endswith(f"{node}/ssd")
        assert rows[node].last_seen_at is not None


def _counters(tiers: list[str]) -> dict[tuple[str, str], float]:
    names = ("bytes_copied", "bytes_sealed", "shards_verified", "corrupt_replicas")
    return {
        (n, t): REGISTRY.get_sample_value(f"tierpoint_worker_{n}_total", {"tier": t}) or 0.0
        for n in names
        for t in tiers
    }


async def test_worker_metrics_count_what_the_lifecycle_did(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    """The counters move by what the catalog says the lifecycle did: bytes read to seal, bytes
    copied and replicas verified per tier, nothing corrupt."""
    tiers = [t.name for t in settings.tiers]
    seeded = seed_checkpoint(settings, sessions, new_job(), 5, random_shards(NODES, 3, 70_001))
    before = _counters(tiers)
    port = free_port()
    async with running_workers(settings, client, metrics_port=port):
        await start_lifecycle(
            client,
            LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step),
        )
        handle = client.get_workflow_handle(
            workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
        )
        result = await asyncio.wait_for(handle.result(), 300)
        async with httpx.AsyncClient() as http:
            exposed = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert [t.state for t in result.tiers] == ["restorable"] * len(tiers)
    moved = {k: v - before[k] for k, v in _counters(tiers).items()}

    with sessions() as s:
        rows = s.execute(
            select(Replica.tier, func.count())
            .where(
                Replica.checkpoint_id == seeded.checkpoint_id,
                Replica.state == ReplicaState.VERIFIED.value,
            )
            .group_by(Replica.tier)
        )
        done = {tier: n for tier, n in rows}
        registered = s.scalar(
            select(func.sum(Shard.size)).where(Shard.checkpoint_id == seeded.checkpoint_id)
        )
    first, *later = tiers
    assert moved[("bytes_sealed", first)] == registered
    assert moved[("bytes_copied", first)] == 0
    for tier in later:
        assert moved[("bytes_copied", tier)] == registered, tier
        assert moved[("bytes_sealed", tier)] == 0, tier
    for tier in tiers:
        assert moved[("shards_verified", tier)] == done[tier] == len(seeded.shards), tier
        assert moved[("corrupt_replicas", tier)] == 0, tier
    # The worker's own endpoint serves the same counters.
    served = {
        (sample.name, sample.labels.get("tier", "")): sample.value
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
    }
    now = _counters(tiers)
    moving = [("bytes_sealed", first)] + [("bytes_copied", t) for t in later]
    for name, tier in moving + [("shards_verified", t) for t in tiers]:
        assert served[(f"tierpoint_worker_{name}_total", tier)] == now[(name, tier)], (name, tier)


def test_the_worker_keeps_its_catalog_connections_open_between_uses(migrated_url: str) -> None:
    """A busy worker's activity threads take and return connections all the time: each one
    returned stays open for the next, instead of Postgres starting a new backend for it."""
    engine = catalog_engine(migrated_url)
    opened: list[object] = []
    event.listen(engine, "connect", lambda conn, _record: opened.append(conn))
    try:
        for _ in range(3):
            held = [engine.connect() for _ in range(WORKER_CONNECTIONS)]
            for c in held:
                c.close()
        assert len(opened) == WORKER_CONNECTIONS
    finally:
        engine.dispose()
