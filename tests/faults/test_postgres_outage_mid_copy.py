"""The catalog's Postgres stops while a copy batch is running (bytes moving, progress in the
catalog): the attempt fails at its next catalog write, the retries fail while the catalog is down,
and once it is back a retry resumes the shard from the last heartbeat; the lifecycle finishes with
every tier restorable and the catalog agrees with every tier's bytes.

By construction, not by timing: the shard is read off the node's ssd at 4 MiB/s (a heartbeat per
8 MiB chunk, ~2 s apart, for a ~12 s copy), and Postgres is stopped only once the catalog shows the
copy to lustre under way and the Temporal server holds a heartbeat with an offset; the test fails
saying so if the copy was too far along by then. Postgres is started again only after two
attempts have failed while it was down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from apps.devstack.services import EmbeddedPostgres
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    POLL,
    db_now,
    eventually,
    make_tier_dirs,
    workers_reported_in,
)
from tests.helpers.lifecycle import (
    NODES,
    ShardSpec,
    crc_hex,
    new_job,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.pending import NO_COPY, pending_copy
from tests.helpers.services import Services, make_bucket, make_settings
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Event, Replica
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

CHUNK = 8 * 1024 * 1024  # a POSIX copy heartbeats once per chunk
SHARD = "big.bin"
SHARD_SIZE = 6 * CHUNK
READ_LIMIT = CHUNK // 2
# Five chunk intervals: a live copy is never taken for a dead one; heartbeats reach the server
# every third of it.
HEARTBEAT_TIMEOUT = 10.0
TOO_LATE = "the copy was nearly done before Postgres could be stopped: slow it down (READ_LIMIT)"


def lustre_replica(engine: Engine, checkpoint_id: int) -> tuple[str | None, int]:
    with engine.connect() as conn:
        row = conn.execute(
            select(Replica.state, Replica.bytes_done).where(
                Replica.checkpoint_id == checkpoint_id, Replica.tier == "lustre"
            )
        ).one_or_none()
    return (str(row[0]), int(row[1] or 0)) if row else (None, 0)


async def test_postgres_down_while_copy_runs_retries_and_resumes(
    dedicated_postgres: EmbeddedPostgres,
    services: Services,
    temporal_namespace: str,
    tmp_path: Path,
) -> None:
    pg = dedicated_postgres
    make_tier_dirs(tmp_path)
    base = make_settings(services, pg.url, tmp_path, make_bucket(services), temporal_namespace)
    ssd = base.tier("ssd").model_copy(update={"read_bandwidth_limit": READ_LIMIT})
    cfg = base.model_copy(
        update={
            "tiers": [ssd, *base.tiers[1:]],
            "batch_heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT,
        }
    )
    engine = make_sync_engine(pg.url, pool_size=2)
    client = await connect(cfg)
    data = os.urandom(SHARD_SIZE)
    job = new_job()
    handle: WorkflowHandle[Any, LifecycleResult] | None = None
    try:
        seeded = seed_checkpoint(
            cfg, sessionmaker(engine), job, 1, [ShardSpec(NODES[0], SHARD, data, crc_hex(data))]
        )
        cp = seeded.checkpoint_id
        handle = client.get_workflow_handle(workflow_id(job, 1), result_type=LifecycleResult)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OVERALL_TIMEOUT
        since = await asyncio.to_thread(db_now, engine)
        async with running_workers(cfg, client, nodes=NODES[:1]):
            await workers_reported_in(engine, NODES[:1], since)
            await start_lifecycle(client, LifecycleInput(checkpoint_id=cp, job=job, step=1))

            # The copy to lustre is under way: progress in the catalog, an offset on the server.
            while True:
                assert loop.time() < deadline, "the copy to lustre never got under way"
                state, done = await asyncio.to_thread(lustre_replica, engine, cp)
                assert state != "verified", TOO_LATE
                pending = await pending_copy(client, handle, "lustre")
                if state == "copying" and done > 0 and pending.offset > 0:
                    break
                await asyncio.sleep(POLL)
            heartbeat_offset = pending.offset
            assert heartbeat_offset <= SHARD_SIZE - 2 * CHUNK, TOO_LATE
            await asyncio.to_thread(pg.stop)
            went_down = time.monotonic()

            # Two attempts fail while the catalog is down: the running one at its next write,
            # then a retry before it could read its batch.
            failures: dict[int, str] = {}

            async def two_failed() -> bool:
                p = await pending_copy(client, handle, "lustre")
                assert p != NO_COPY, TOO_LATE
                if p.attempt >= 2:
                    failures[p.attempt - 1] = p.last_failure
                return p.attempt >= 3

            await eventually(
                "two attempts of the copy failed while the catalog is down", two_failed
            )
            print(
                f"copy while the catalog is down: {[failures[k][:160] for k in sorted(failures)]}"
            )
            assert all("OperationalError" in f or "connect" in f for f in failures.values())

            await asyncio.to_thread(pg.start)
            print(f"catalog was down {time.monotonic() - went_down:.1f}s")
            result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)

        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ]
        with engine.connect() as conn:
            copied = [
                d
                for (d,) in conn.execute(
                    select(Event.detail)
                    .where(
                        Event.checkpoint_id == cp, Event.kind == "copied", Event.tier == "lustre"
                    )
                    .order_by(Event.id)
                )
            ]
        # The failed attempts never reported; the one that did resumed from a heartbeat of the
        # attempt the outage interrupted, and read only the rest of the shard.
        assert len(copied) == 1, copied
        assert copied[0]["attempt"] >= 3
        resumed = copied[0]["resumed"]
        assert [r["path"] for r in resumed] == [SHARD], copied[0]
        assert heartbeat_offset <= resumed[0]["offset"] < SHARD_SIZE
        assert copied[0]["bytes"] == SHARD_SIZE - resumed[0]["offset"]

        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        # A lifecycle of this catalog must not outlive it.
        if handle is not None:
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("postgres fault test ended")
        engine.dispose()
