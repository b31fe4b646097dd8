from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import Engine, text
from temporalio.client import Client

from api.app import create_app
from apps.devstack.services import free_port
from tests.helpers.api import (
    NODE_A,
    NODE_B,
    counts,
    manifest,
    running_client,
    scrape_api,
    shard,
    workflow_count,
)
from tierpoint.config import Settings

PROBLEM = "application/problem+json"


async def _wait_workflows(temporal: Client, job: str, step: int) -> int:
    # Visibility is updated asynchronously by the server: wait for the first, then count.
    for _ in range(100):
        n = await workflow_count(temporal, job, step)
        if n:
            return n
        await asyncio.sleep(0.1)
    return 0


async def test_register_then_same_manifest_then_conflict(
    client: httpx.AsyncClient, job: str, temporal: Client, catalog: Engine
) -> None:
    body = manifest(
        7, [shard("model/rank0.pt", NODE_A, 100), shard("model/rank1.pt", NODE_B, 50)], loss=1.5
    )
    first = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert first.status_code == 201, first.text
    cp = first.json()
    assert cp["job"] == job and cp["step"] == 7
    assert cp["total_bytes"] == 150 and cp["shard_count"] == 2
    assert cp["metadata"] == {"loss": 1.5}
    assert [t["tier"] for t in cp["tiers"]] == ["ssd", "lustre", "s3"]
    assert [t["kind"] for t in cp["tiers"]] == ["local", "shared", "s3"]
    assert all(t["state"] == "pending" for t in cp["tiers"])
    assert cp["tiers"][0]["progress"] == {
        "shards_total": 2,
        "shards_verified": 0,
        "bytes_total": 150,
        "bytes_done": 0,
    }
    before = counts(catalog)

    # Same shards in another order and other metadata: the same manifest.
    again = manifest(
        7, [shard("model/rank1.pt", NODE_B, 50), shard("model/rank0.pt", NODE_A, 100)], loss=9.0
    )
    second = await client.post(f"/v1/jobs/{job}/checkpoints", json=again)
    assert second.status_code == 200, second.text
    assert second.json()["created_at"] == cp["created_at"]
    assert second.json()["metadata"] == {"loss": 1.5}

    different = manifest(7, [shard("model/rank0.pt", NODE_A, 101)])
    conflict = await client.post(f"/v1/jobs/{job}/checkpoints", json=different)
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == PROBLEM
    problem = conflict.json()
    assert problem["code"] == "checkpoint_conflict"
    assert problem["status"] == 409 and problem["type"].endswith("checkpoint_conflict")
    assert counts(catalog) == before

    assert await _wait_workflows(temporal, job, 7) == 1
    with catalog.connect() as conn:
        started = conn.execute(
            text(
                "SELECT c.workflow_started_at FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :j"
            ),
            {"j": job},
        ).scalar_one()
    assert started is not None
    detail = (await client.get(f"/v1/jobs/{job}/checkpoints/7")).json()
    assert detail["workflow_started"] is True

    metrics = await scrape_api(client)
    assert 'tierpoint_api_registrations_total{outcome="created"} 1.0' in metrics
    assert 'tierpoint_api_registrations_total{outcome="existing"} 1.0' in metrics
    assert "tierpoint_api_registration_conflicts_total 1.0" in metrics
    assert 'route="/v1/jobs/{job}/checkpoints"' in metrics


async def test_concurrent_identical_registrations_make_one_checkpoint(
    client: httpx.AsyncClient, job: str, temporal: Client, catalog: Engine
) -> None:
    body = manifest(3, [shard(f"s{i}", NODE_A if i % 2 else NODE_B) for i in range(50)])
    answers = await asyncio.gather(
        *(client.post(f"/v1/jobs/{job}/checkpoints", json=body) for _ in range(8))
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 7 + [201], [a.text for a in answers]
    with catalog.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM checkpoint c JOIN job j ON j.id = c.job_id WHERE j.name = :j"
            ),
            {"j": job},
        ).scalar_one()
        shards = conn.execute(
            text(
                "SELECT count(*) FROM shard s JOIN checkpoint c ON c.id = s.checkpoint_id "
                "JOIN job j ON j.id = c.job_id WHERE j.name = :j"
            ),
            {"j": job},
        ).scalar_one()
    assert (n, shards) == (1, 50)
    assert await _wait_workflows(temporal, job, 3) == 1


async def test_registration_succeeds_without_temporal(
    settings: Settings, nodes: tuple[str, str], job: str, catalog: Engine
) -> None:
    down = settings.model_copy(update={"temporal_address": f"127.0.0.1:{free_port()}"})
    async for client in running_client(create_app(down)):
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("a")]))
        assert r.status_code == 201, r.text
        assert r.json()["workflow_started"] is False
        # Retrying is safe and still does not need Temporal.
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("a")]))
        assert r.status_code == 200
        assert r.json()["workflow_started"] is False
        metrics = await scrape_api(client)
        assert 'tierpoint_api_workflow_starts_total{outcome="failed"}' in metrics
    with catalog.connect() as conn:
        started = conn.execute(
            text(
                "SELECT c.workflow_started_at FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :j"
            ),
            {"j": job},
        ).one()
    assert started.workflow_started_at is None


async def test_concurrent_different_manifests_one_wins(
    client: httpx.AsyncClient, job: str, catalog: Engine
) -> None:
    a = manifest(4, [shard("x", NODE_A, 1)])
    b = manifest(4, [shard("x", NODE_A, 2)])
    answers = await asyncio.gather(
        *(client.post(f"/v1/jobs/{job}/checkpoints", json=body) for body in (a, b, a, b))
    )
    created = [r for r in answers if r.status_code == 201]
    assert len(created) == 1, [r.text for r in answers]
    winner = created[0].json()["total_bytes"]
    for r in answers:
        if r.status_code == 200:
            assert r.json()["total_bytes"] == winner
        elif r.status_code != 201:
            assert r.status_code == 409 and r.json()["code"] == "checkpoint_conflict"
    assert sorted(r.status_code for r in answers) == [200, 201, 409, 409]
    with catalog.connect() as conn:
        sizes = (
            conn.execute(
                text(
                    "SELECT s.size FROM shard s JOIN checkpoint c ON c.id = s.checkpoint_id "
                    "JOIN job j ON j.id = c.job_id WHERE j.name = :j"
                ),
                {"j": job},
            )
            .scalars()
            .all()
        )
    assert sizes == [winner]
