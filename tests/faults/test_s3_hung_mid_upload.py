"""The S3 endpoint hangs (SIGSTOP: connections are accepted, nothing is answered) while a multipart
upload of a large shard is in flight, then resumes (SIGCONT) with its state intact: Temporal
times the silent attempt out on its heartbeat and retries it, the retry continues the same upload
from the last heartbeat instead of sending the shard again, and the checkpoint ends restorable on
s3 with the exact bytes and no upload left behind, while the catalog agrees with every tier.

The other fault, an endpoint that comes back empty, is test_s3_outage_mid_upload.py. By construction
as there: six 5 MiB parts read off the node's ssd at 3 MB/s, the endpoint paused only once the
catalog shows the upload under way and the server holds its upload id and an offset, and resumed
only once an attempt has timed out. The heartbeat timeout (10 s) is well under botocore's read
timeout (60 s), so it is Temporal, not the S3 client, that notices the hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from apps.devstack.services import MotoS3Server
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    POLL,
    eventually,
    s3_client_for,
    s3_replica,
    slow_upload,
    upload_heartbeat,
    upload_under_way,
)
from tests.helpers.lifecycle import (
    NODES,
    crc_hex,
    running_workers,
)
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Event
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import COPY_BATCH, LifecycleInput, LifecycleResult, workflow_id
from tierpoint.storage.checksum import crc32c_to_base64
from tierpoint.temporal import connect, start_lifecycle

PART = 5 * 1024 * 1024
SHARD = "big.bin"
SHARD_SIZE = 6 * PART
READ_LIMIT = 3_000_000
HEARTBEAT_TIMEOUT = 10.0
TOO_LATE = "the upload was nearly done before S3 could be paused: slow it down (READ_LIMIT)"


async def test_s3_endpoint_hung_mid_multipart_upload_times_out_and_resumes_same_upload(
    settings: Settings, tmp_path: Path
) -> None:
    bucket = f"tp-fault-{uuid.uuid4().hex[:12]}"
    moto = MotoS3Server()
    await asyncio.to_thread(moto.start, tmp_path / "moto.log")
    pid = moto.pid
    assert pid is not None
    paused = False
    engine = make_sync_engine(settings.database_url, pool_size=2)
    client = await connect(settings)
    handle: WorkflowHandle[Any, LifecycleResult] | None = None
    try:
        s3 = s3_client_for(moto)
        s3.create_bucket(Bucket=bucket)
        up = slow_upload(
            settings,
            engine,
            endpoint_url=moto.endpoint_url,
            bucket=bucket,
            step=5,
            path=SHARD,
            size=SHARD_SIZE,
            part_size=PART,
            read_limit=READ_LIMIT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
        )
        cfg, node_cfg, data, key = up.cfg, up.node_cfg, up.data, up.key
        job, step, cp = up.job, up.step, up.checkpoint_id
        handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OVERALL_TIMEOUT

        async with (
            running_workers(node_cfg, client, nodes=NODES[:1], shared=False),
            running_workers(cfg, client, nodes=[], shared=True),
        ):
            await start_lifecycle(client, LifecycleInput(checkpoint_id=cp, job=job, step=step))
            upload_id, resume_offset = await upload_under_way(
                client, handle, engine, cp, deadline=deadline, too_late=TOO_LATE
            )
            assert resume_offset <= SHARD_SIZE - 2 * PART, TOO_LATE
            os.kill(pid, signal.SIGSTOP)
            paused = True
            went_silent = time.monotonic()

            state, done = await asyncio.to_thread(s3_replica, engine, cp)
            assert state == "copying" and 0 < done < SHARD_SIZE, f"{TOO_LATE} ({state}, {done})"
            timed_out: list[str] = []

            async def attempt_timed_out() -> bool:
                desc = await handle.describe()
                for pa in desc.raw_description.pending_activities:
                    if pa.activity_type.name == COPY_BATCH and pa.attempt >= 2:
                        failure = pa.last_failure
                        timed_out.append(failure.message)
                        # A heartbeat timeout, not an error of the S3 client.
                        assert failure.HasField("timeout_failure_info"), failure
                        return True
                return False

            await eventually("the silent attempt timed out and is retried", attempt_timed_out)
            os.kill(pid, signal.SIGCONT)
            paused = False
            print(f"S3 hung {time.monotonic() - went_silent:.1f}s: {timed_out[-1]}")

            result_task = asyncio.ensure_future(handle.result())
            uploads: set[str] = set()
            try:
                while not result_task.done():
                    assert loop.time() < deadline, "the lifecycle did not finish"
                    _, beat = await upload_heartbeat(client, handle)
                    if beat.get("upload_id"):
                        uploads.add(str(beat["upload_id"]))
                    await asyncio.wait({result_task}, timeout=POLL)
                result = result_task.result()
            finally:
                result_task.cancel()

        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ]
        obj = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert obj["Body"].read() == data
        assert obj.get("ChecksumCRC32C") == crc32c_to_base64(int(crc_hex(data), 16))
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        # The endpoint kept the upload: the retries continued it, none started another.
        assert uploads <= {upload_id}, uploads
        with engine.connect() as conn:
            copied = [
                d
                for (d,) in conn.execute(
                    select(Event.detail)
                    .where(Event.checkpoint_id == cp, Event.kind == "copied", Event.tier == "s3")
                    .order_by(Event.id)
                )
            ]
        assert copied and all(c["attempt"] >= 2 for c in copied), copied
        resumed = copied[-1]["resumed"]
        assert [r["path"] for r in resumed] == [SHARD], copied
        assert resume_offset <= resumed[0]["offset"] < SHARD_SIZE, copied

        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        if paused:
            os.kill(pid, signal.SIGCONT)
        if handle is not None:
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("s3 fault test ended")
        await asyncio.to_thread(moto.stop)
        engine.dispose()
