"""A storm: 100 checkpoints registered at once through the API, from 8 simulated nodes (4 jobs
of 2 nodes, 25 steps each), while a node worker process and the shared worker process are each
SIGKILLed once and started again. Every lifecycle completes with every tier restorable, at rest
every checkpoint is restorable on every tier (the jobs' policy keeps every copy) and the catalog
agrees with every tier's bytes.

Processes: 2 cores cannot take 8 node worker processes plus the shared one and the test, so the 8
nodes are served by 2 node worker processes of 4 nodes each (`tierpoint worker --node` given 4
times; each node keeps its own task queue) and one shared worker process. Killing a node worker
process takes 4 nodes' workers down at once.

By construction, not by timing: each kill waits until some lifecycles have completed (so the
workers are under load) and checks that others are still in flight, failing with TOO_FAST if the
storm had passed by then. Shards are tiny (4 KiB): this is about many lifecycles and their
activities, not bytes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session
from temporalio.client import Client, WorkflowExecutionStatus

from api.app import create_app
from apps.worker import node_roots
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_nothing_lost
from tests.helpers.faults import OVERALL_TIMEOUT, eventually
from tests.helpers.lifecycle import crc_hex, new_job
from tests.helpers.worker_process import WorkerProcess
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleResult, workflow_id

NODES = [f"storm-node-{i}" for i in range(8)]
JOBS = 4  # each on 2 of the nodes
STEPS = 25
SHARD_SIZE = 4096
# A killed worker's running activities are handed on after this.
HEARTBEAT_TIMEOUT = 5.0
REGISTER_TRIES = 5
TOO_FAST = "the storm had passed before the kill: add checkpoints or shrink the kill threshold"


async def register(api: httpx.AsyncClient, job: str, manifest: dict[str, Any]) -> httpx.Response:
    """A registration as the training client sends it: again, after a pause, while the answer is
    503 (on a starved machine a request of the storm can wait past the API's limit for a catalog
    connection; it wrote nothing, so the next try creates the checkpoint)."""
    for _ in range(REGISTER_TRIES - 1):
        r = await api.post(f"/v1/jobs/{job}/checkpoints", json=manifest)
        if r.status_code != 503:
            return r
        await asyncio.sleep(2)
    return await api.post(f"/v1/jobs/{job}/checkpoints", json=manifest)


def done_count(engine: Engine, jobs: list[str]) -> int:
    """Checkpoints of these jobs whose lifecycle has promoted the last tier (s3)."""
    with engine.connect() as conn:
        n = conn.scalar(
            text(
                "SELECT count(*) FROM checkpoint_tier ct JOIN job j ON j.id = ct.job_id "
                "WHERE j.name = ANY(:jobs) AND ct.tier = 's3' AND ct.state = 'restorable'"
            ),
            {"jobs": jobs},
        )
    return int(n or 0)


async def kill_and_restart(
    worker: WorkerProcess, settings: Settings, nodes: list[str] | None, log: Path
) -> WorkerProcess:
    assert worker.alive(), worker.output()
    assert worker.kill() == -9
    return WorkerProcess(settings, nodes, log)


@pytest.mark.slow
async def test_storm_of_registrations_with_workers_killed_loses_nothing(
    settings: Settings, engine: Engine, client: Client, tmp_path: Path
) -> None:
    cfg = settings.model_copy(update={"batch_heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT})
    ssd = cfg.tier("ssd")
    with Session(engine) as s:
        for node in NODES:
            ssd.root_for(node).mkdir(parents=True)
            upsert_node(s, node, node_roots(cfg, node))
        s.commit()
    jobs = [new_job() for _ in range(JOBS)]
    manifests: list[tuple[str, int, dict[str, Any]]] = []
    for j, job in enumerate(jobs):
        pair = NODES[2 * j : 2 * j + 2]
        for step in range(1, STEPS + 1):
            shards = []
            for rank, node in enumerate(pair):
                data = os.urandom(SHARD_SIZE)
                path = f"rank-{rank}/shard.bin"
                f = ssd.root_for(node) / job / str(step) / path
                f.parent.mkdir(parents=True)
                f.write_bytes(data)
                shards.append(
                    {"path": path, "size": len(data), "crc32c": crc_hex(data), "node": node}
                )
            manifests.append((job, step, {"step": step, "shards": shards, "metadata": {}}))

    half = len(NODES) // 2
    logs = tmp_path
    node_a: WorkerProcess | None = None
    node_b: WorkerProcess | None = None
    shared: WorkerProcess | None = None
    try:
        node_a = WorkerProcess(cfg, NODES[:half], logs / "nodes-a-1.log")
        node_b = WorkerProcess(cfg, NODES[half:], logs / "nodes-b.log")
        shared = WorkerProcess(cfg, None, logs / "shared-1.log")

        async for api in running_client(create_app(cfg)):
            # Every copy is kept, so that at the end every tier must hold every checkpoint (and
            # the storm is all lifecycles, not expiries: retention has tests of its own).
            policy = f"storm-{jobs[0]}"
            keep_all = {"format": 1, "kinds": {"local": {}, "shared": {}}}
            made = await api.post("/v1/policies", json={"name": policy, "spec": keep_all})
            assert made.status_code == 201, made.text
            for job in jobs:
                assigned = await api.put(f"/v1/jobs/{job}/policy", json={"policy": policy})
                assert assigned.status_code == 200, assigned.text
            answers = await asyncio.gather(*(register(api, job, m) for job, _, m in manifests))
        assert [r.status_code for r in answers] == [201] * len(manifests), [
            r.text for r in answers if r.status_code != 201
        ][:3]

        total = len(manifests)

        async def at_least(n: int) -> bool:
            for w in (node_a, node_b, shared):
                assert w is not None and w.alive(), w.output() if w else ""
            return await asyncio.to_thread(done_count, engine, jobs) >= n

        await eventually("a first checkpoints completed", lambda: at_least(10))
        in_flight = total - await asyncio.to_thread(done_count, engine, jobs)
        assert in_flight > 0, TOO_FAST
        node_a = await kill_and_restart(node_a, cfg, NODES[:half], logs / "nodes-a-2.log")
        print(f"node worker process killed with {in_flight} checkpoints in flight")

        await eventually("more checkpoints completed", lambda: at_least(20))
        in_flight = total - await asyncio.to_thread(done_count, engine, jobs)
        assert in_flight > 0, TOO_FAST
        shared = await kill_and_restart(shared, cfg, None, logs / "shared-2.log")
        print(f"shared worker process killed with {in_flight} checkpoints in flight")

        handles = [
            client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
            for job, step, _ in manifests
        ]
        results = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in handles)), OVERALL_TIMEOUT
        )
    finally:
        # At rest before the check: no copy or expiry may change a tier while it is read.
        for w in (node_a, node_b, shared):
            if w is not None:
                w.kill()

    for (job, step, _), result in zip(manifests, results, strict=True):
        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ], (job, step, result)
    for h in handles:
        assert (await h.describe()).status == WorkflowExecutionStatus.COMPLETED

    with engine.connect() as conn:
        ids = list(
            conn.scalars(
                select(Checkpoint.id)
                .join(Job, Job.id == Checkpoint.job_id)
                .where(Job.name.in_(jobs))
            )
        )
    assert len(ids) == total
    checked = assert_nothing_lost(cfg, engine, {cp: ("ssd", "lustre", "s3") for cp in ids})
    assert checked.restorable == {"ssd": total, "lustre": total, "s3": total}, checked
    assert checked.verified == {"ssd": 2 * total, "lustre": 2 * total, "s3": 2 * total}, checked
    print(f"at rest: verified {dict(checked.verified)}, restorable {dict(checked.restorable)}")
