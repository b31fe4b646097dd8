"""A real lifecycle (ssd -> lustre -> s3) registered through `tierpoint api`, with the node
worker and the shared worker as `tierpoint worker --metrics-port` processes, all logging JSON:
afterwards their /metrics (real HTTP on 127.0.0.1) show what happened on every tier, and every
line they logged about the checkpoint says whose it is."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from apps.devstack.services import free_port
from tests.helpers.api import manifest, shard
from tests.helpers.lifecycle import crc_hex
from tests.helpers.scrape import (
    Samples,
    json_lines,
    parse,
    scrape,
    tierpoint_process,
    value,
    wait_serving,
    worker_with_metrics,
)
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

NODE = "node-a"
STEP = 40
TIERS = ("ssd", "lustre", "s3")
CHECKPOINT_KEYS = {"job", "step", "tier", "node"}
# Guards against a hang only; nothing asserts on how long anything took.
HANG = 300


async def _node_known(catalog: Engine) -> None:
    def known() -> bool:
        with catalog.connect() as conn:
            row = conn.execute(text("SELECT 1 FROM node WHERE id = :n"), {"n": NODE}).first()
            return row is not None

    # The worker reports its node in once running: there is no event to wait on across processes.
    while not await asyncio.to_thread(known):  # noqa: ASYNC110
        await asyncio.sleep(0.2)


def _write_shards(settings: Settings, job: str) -> list[dict[str, Any]]:
    root = settings.tier("ssd").root_for(NODE) / job / str(STEP)
    shards = []
    for i, size in enumerate((300_000, 70_001, 12)):
        data = os.urandom(size)
        path = f"rank0/shard-{i}.bin"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        shards.append(shard(path, NODE, size, crc_hex(data)))
    return shards


async def _restorable_everywhere(api: httpx.AsyncClient, job: str) -> None:
    while True:
        r = await api.get(f"/v1/jobs/{job}/checkpoints/{STEP}")
        assert r.status_code == 200, r.text
        states = {t["tier"]: (t["state"], t["reason"]) for t in r.json()["tiers"]}
        assert not [t for t, (s, _) in states.items() if s == "failed"], states
        if {s for s, _ in states.values()} == {"restorable"}:
            return
        await asyncio.sleep(0.2)


async def _refreshed(metrics_port: int, job: str) -> Samples:
    """The API's metrics (its own listener) once its refresher has seen the finished checkpoint."""
    while True:
        samples = parse(await scrape(metrics_port))
        done = all(
            value(samples, "tierpoint_checkpoints_in_flight", tier=t) == 0
            and value(samples, "tierpoint_recovery_point_age_seconds", job=job, tier=t) is not None
            for t in TIERS
        )
        if done:
            return samples
        await asyncio.sleep(0.2)


async def test_a_lifecycle_shows_on_every_tier_in_metrics_and_logs(
    settings: Settings, job: str, catalog: Engine, tmp_path: Path
) -> None:
    cfg = settings.model_copy(update={"metrics_refresh_seconds": 0.2})
    node_port, shared_port = free_port(), free_port()
    node_log, shared_log = tmp_path / "node-worker.log", tmp_path / "shared-worker.log"
    api_log = tmp_path / "api.log"
    shards = _write_shards(cfg, job)
    total = sum(s["size"] for s in shards)
    with (
        worker_with_metrics(cfg, ["--node", NODE, "--no-shared"], node_port, node_log) as node,
        worker_with_metrics(cfg, [], shared_port, shared_log) as shared,
    ):
        async with asyncio.timeout(HANG):
            await wait_serving(node, node_port, node_log)
            await wait_serving(shared, shared_port, shared_log)
            await _node_known(catalog)
            api_port, api_metrics_port = free_port(), free_port()
            api_args = ["api", "--host", "127.0.0.1", "--port", str(api_port)]
            api_args += ["--metrics-port", str(api_metrics_port)]
            with tierpoint_process(cfg, api_args, api_log) as api_proc:
                await wait_serving(api_proc, api_port, api_log, "/healthz")
                headers = bearer(create_token(catalog))
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{api_port}", headers=headers, timeout=60
                ) as api:
                    r = await api.post(f"/v1/jobs/{job}/checkpoints", json=manifest(STEP, shards))
                    assert r.status_code == 201, r.text
                    await _restorable_everywhere(api, job)
                    api_metrics = await _refreshed(api_metrics_port, job)
                    # The next request is about no checkpoint: nothing of the registration's
                    # context may stick to its lines.
                    assert (await api.get("/v1/tiers")).status_code == 200
            on_node = parse(await scrape(node_port))
            on_shared = parse(await scrape(shared_port))

    # The node worker sealed ssd and copied from it to lustre and to s3 (the copies fan out from
    # the sealed tier, read where it is); the shared worker promoted.
    assert (value(on_node, "tierpoint_worker_bytes_sealed_total", tier="ssd") or 0) >= total
    for samples, tier in ((on_node, "ssd"), (on_node, "lustre"), (on_node, "s3")):
        assert (value(samples, "tierpoint_worker_bytes_verified_total", tier=tier) or 0) >= total
        assert (value(samples, "tierpoint_worker_shards_verified_total", tier=tier) or 0) >= 3
        assert not value(samples, "tierpoint_worker_verification_failures_total", tier=tier)
    for samples, tier in ((on_node, "lustre"), (on_node, "s3")):
        assert (value(samples, "tierpoint_worker_bytes_copied_total", tier=tier) or 0) >= total
        count = "tierpoint_worker_copy_throughput_bytes_per_second_count"
        assert (value(samples, count, tier=tier) or 0) >= 1
    # Promotions run on the shared worker: one lag observation per tier, never one per rerun.
    for tier in TIERS:
        lag = "tierpoint_worker_promotion_lag_seconds"
        assert value(on_shared, f"{lag}_count", tier=tier) == 1
        assert (value(on_shared, f"{lag}_sum", tier=tier) or -1) >= 0

    for tier in TIERS:
        age = value(api_metrics, "tierpoint_recovery_point_age_seconds", job=job, tier=tier)
        assert age is not None and age >= 0
        behind = value(api_metrics, "tierpoint_recovery_point_steps_behind", job=job, tier=tier)
        assert behind == 0
        assert value(api_metrics, "tierpoint_checkpoints_in_flight", tier=tier) == 0
    free = value(api_metrics, "tierpoint_tier_free_bytes", tier="lustre")
    capacity = value(api_metrics, "tierpoint_tier_capacity_bytes", tier="lustre")
    assert free is not None and capacity is not None and 0 < free <= capacity
    route = {"method": "POST", "route": "/v1/jobs/{job}/checkpoints"}
    assert (value(api_metrics, "tierpoint_api_request_duration_seconds_count", **route) or 0) >= 1
    assert value(api_metrics, "tierpoint_api_registrations_total", outcome="created") == 1

    lines = [*json_lines(node_log), *json_lines(shared_log)]
    about = [line for line in lines if line.get("job") == job]
    # Nothing about the checkpoint was logged without saying whose it is.
    assert about and all(line.keys() >= CHECKPOINT_KEYS for line in about), about
    assert all(line["step"] == STEP for line in about)
    seen = {(line["event"], line["tier"], line["node"]) for line in about}
    assert ("batch sealed", "ssd", NODE) in seen
    assert ("batch copied and verified", "lustre", NODE) in seen
    assert ("batch copied and verified", "s3", NODE) in seen
    for tier in TIERS:
        assert ("tier restorable", tier, None) in seen
    copies = [line for line in about if line["event"] == "batch copied and verified"]
    assert {line["source"] for line in copies} == {"ssd"}  # every copy reads the sealed tier
    assert sum(line["bytes"] for line in copies if line["tier"] == "s3") >= total

    api_lines = json_lines(api_log)
    # Every line the API wrote is JSON, uvicorn's own too (its start and stop).
    written = api_log.read_text().splitlines()
    assert len(api_lines) == len(written), written
    assert any(line.get("logger", "").startswith("uvicorn") for line in api_lines), api_lines
    registered = [line for line in api_lines if line["event"] == "checkpoint registered"]
    assert [(line["job"], line["step"], line["created"]) for line in registered] == [
        (job, STEP, True)
    ]
    access = [line for line in api_lines if line["event"] == "request"]
    posts = [line for line in access if line["method"] == "POST"]
    assert [(line["job"], line["step"]) for line in posts] == [(job, STEP)]
    tiers_reads = [line for line in access if line["route"] == "/v1/tiers"]
    assert tiers_reads and all("job" not in line for line in tiers_reads), tiers_reads
