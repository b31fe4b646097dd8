"""The Temporal server restarted while a lifecycle uploads a shard to S3, then the catalog's
Postgres restarted while the same upload still runs: the workflow execution survives both (same
run, its history kept in the server's SQLite file), the workers carry on without a restart of
their own (the node's, which uploads from its local copy, is a process of its own), and
the checkpoint ends restorable on every tier with the original bytes.

The session's Temporal server is shared by every test module, so this test runs a dev server of
its own on a database file (what `tierpoint dev` does) and stops and starts it on the same port.
Postgres alone going away mid-copy, with retries failing while it is down, is
test_postgres_outage_mid_copy.py; here both come back, one after the other.

By construction, not by timing: six 5 MiB parts read off the node's ssd at 3 MB/s by its worker
(~10 s); Temporal is stopped only once the catalog shows the upload under way and the server holds
its upload id and an offset, Postgres only once Temporal is back, and each step first checks that
the upload is still under way, failing with TOO_LATE if it is not."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from apps.devstack.services import EmbeddedPostgres, TemporalDevServer
from tests.helpers.consistency import assert_nothing_lost
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    make_tier_dirs,
    s3_replica,
    slow_upload,
    upload_under_way,
)
from tests.helpers.lifecycle import NODES, running_workers
from tests.helpers.services import Services, make_bucket, make_settings, s3_client
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

PART = 5 * 1024 * 1024
SHARD = "big.bin"
SHARD_SIZE = 6 * PART
READ_LIMIT = 3_000_000
HEARTBEAT_TIMEOUT = 10.0
TOO_LATE = "the upload finished before both restarts: slow it down (READ_LIMIT)"


async def still_uploading(engine: Engine, checkpoint_id: int) -> None:
    state, done = await asyncio.to_thread(s3_replica, engine, checkpoint_id)
    assert state == "copying" and done < SHARD_SIZE, f"{TOO_LATE} (s3 {state}, {done})"


async def test_temporal_then_postgres_restarted_mid_upload_lifecycle_completes(
    dedicated_postgres: EmbeddedPostgres, services: Services, tmp_path: Path
) -> None:
    pg = dedicated_postgres
    temporal = TemporalDevServer(tmp_path / "temporal.db")
    await asyncio.to_thread(temporal.start, tmp_path / "temporal-1.log")
    revived: TemporalDevServer | None = None
    make_tier_dirs(tmp_path)
    base = make_settings(services, pg.url, tmp_path, make_bucket(services))
    base = base.model_copy(update={"temporal_address": temporal.address})
    engine = make_sync_engine(pg.url, pool_size=2)
    client: Client = await connect(base)
    handle: WorkflowHandle[Any, LifecycleResult] | None = None
    try:
        up = slow_upload(
            base,
            engine,
            endpoint_url=services.s3_endpoint_url,
            bucket=str(base.tier("s3").bucket),
            step=1,
            path=SHARD,
            size=SHARD_SIZE,
            part_size=PART,
            read_limit=READ_LIMIT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
        )
        cfg, node_cfg, data = up.cfg, up.node_cfg, up.data
        cp, job, step = up.checkpoint_id, up.job, up.step
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OVERALL_TIMEOUT
        # The node's worker, which uploads (the copies fan out from its local copy), is a process
        # of its own; the shared worker, which runs the workflow, runs in the test.
        async with running_workers(cfg, client, nodes=[], shared=True):
            with worker_process(node_cfg, NODES[0], tmp_path / "node-worker.log") as node_worker:
                await start_lifecycle(client, LifecycleInput(checkpoint_id=cp, job=job, step=step))
                handle = client.get_workflow_handle(
                    workflow_id(job, step), result_type=LifecycleResult
                )
                run_id = (await handle.describe()).run_id
                await upload_under_way(
                    client, handle, engine, cp, deadline=deadline, too_late=TOO_LATE
                )
                t0 = loop.time()
                await asyncio.to_thread(temporal.stop)
                await still_uploading(engine, cp)
                revived = TemporalDevServer(tmp_path / "temporal.db", port=temporal.port)
                await asyncio.to_thread(revived.start, tmp_path / "temporal-2.log")
                client = await connect(cfg)
                handle = client.get_workflow_handle(
                    workflow_id(job, step), result_type=LifecycleResult
                )
                desc = await handle.describe()
                assert desc.run_id == run_id and desc.status == WorkflowExecutionStatus.RUNNING

                await still_uploading(engine, cp)
                t1 = loop.time()
                await asyncio.to_thread(pg.stop)
                await asyncio.to_thread(pg.start)
                t2 = loop.time()

                result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
                print(
                    f"temporal restart {t1 - t0:.1f}s, postgres restart {t2 - t1:.1f}s, "
                    f"then lifecycle done in {loop.time() - t2:.1f}s"
                )
                assert node_worker.alive(), f"died with a restart:\n{node_worker.output()}"

        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ]
        assert (await handle.describe()).run_id == run_id
        assert (tmp_path / "lustre" / job / str(step) / SHARD).read_bytes() == data
        s3 = s3_client(services)
        assert s3.get_object(Bucket=base.tier("s3").bucket, Key=up.key)["Body"].read() == data
        checked = assert_nothing_lost(cfg, engine, {cp: ("ssd", "lustre", "s3")})
        assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("temporal restart test ended")
        for server in (revived, temporal):
            if server is not None:
                await asyncio.to_thread(server.stop)
        engine.dispose()
