"""The S3 endpoint dies while a multipart upload of a large shard is in flight and a fresh one
comes back on the same address: the copy notices that its upload no longer exists, starts a new
one, and the checkpoint ends restorable on s3 with the exact bytes and no upload left behind.

Which fault: moto keeps everything in memory, so the endpoint that comes back has lost the
bucket, the upload id and its parts, as an S3-compatible store restored from an older state or
replaced by a new one would. That is the hard case for a resumed copy: the retry is handed a
resume point (upload id, offset) that the endpoint denies (NoSuchBucket until the bucket is made
again, then NoSuchUpload), and must start over instead of failing on it until it gives up.
A hung endpoint (SIGSTOP) is a different fault, not covered here.

By construction, not by timing: the shard is six 5 MiB parts sent one at a time, read off the
node's ssd at 3 MB/s (10 s or more for the upload: the copy to lustre reads under the same
limit); the endpoint is stopped only once the catalog shows the upload under way and the
Temporal server holds a heartbeat with its upload id and an offset, and the test fails saying so
if the upload was too far along by then."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from sqlalchemy import select
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from apps.devstack.services import MotoS3Server
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    POLL,
    failed_attempts,
    marker_states,
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
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.storage.checksum import crc32c_to_base64
from tierpoint.temporal import connect, start_lifecycle

PART = 5 * 1024 * 1024  # S3's smallest part
SHARD = "big.bin"
SHARD_SIZE = 6 * PART
# Reads off the node's ssd (the s3 stage's source) at 3 MB/s: a part every ~1.7 s or slower
# (the copy to lustre reads under the same limit).
READ_LIMIT = 3_000_000
# Well above botocore's own retries of one request (~15 s at most), so the outage fails the
# attempt rather than timing it out; the worker sends heartbeats every tenth of it.
HEARTBEAT_TIMEOUT = 20.0
TOO_LATE = "the upload was nearly done before S3 could be stopped: slow it down (READ_LIMIT)"


async def test_s3_endpoint_replaced_mid_multipart_upload_restarts_upload(
    settings: Settings, tmp_path: Path
) -> None:
    bucket = f"tp-fault-{uuid.uuid4().hex[:12]}"
    moto = MotoS3Server()
    await asyncio.to_thread(moto.start, tmp_path / "moto-1.log")
    revived: MotoS3Server | None = None
    engine = make_sync_engine(settings.database_url, pool_size=2)
    client = await connect(settings)
    handle: WorkflowHandle[Any, LifecycleResult] | None = None
    try:
        s3_client_for(moto).create_bucket(Bucket=bucket)
        up = slow_upload(
            settings,
            engine,
            endpoint_url=moto.endpoint_url,
            bucket=bucket,
            step=4,
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

            # Wait until the upload is under way: parts done in the catalog, and the server
            # holding the upload id and an offset for a retry to resume from.
            first_upload, resume_offset = await upload_under_way(
                client, handle, engine, cp, deadline=deadline, too_late=TOO_LATE
            )
            assert resume_offset % PART == 0 and resume_offset <= SHARD_SIZE - 2 * PART, TOO_LATE
            s3 = s3_client_for(moto)
            parts = s3.list_parts(Bucket=bucket, Key=key, UploadId=first_upload)["Parts"]
            assert len(parts) >= resume_offset // PART, parts
            await asyncio.to_thread(moto.stop)
            went_down = time.monotonic()

            state, done = await asyncio.to_thread(s3_replica, engine, cp)
            assert state == "copying" and 0 < done < SHARD_SIZE, f"{TOO_LATE} ({state}, {done})"
            # Two attempts fail while it is down: the first mid-upload, the next before any
            # progress of its own, which must still hand the resume point on.
            failures = await failed_attempts(handle, 2)
            print(f"upload while S3 is down: {failures}")
            states = await asyncio.to_thread(marker_states, engine, cp)
            assert states["s3"] != "restorable", states

            # A fresh, empty endpoint on the same address: the upload and its parts are gone.
            revived = MotoS3Server(port=moto.port)
            await asyncio.to_thread(revived.start, tmp_path / "moto-2.log")
            s3 = s3_client_for(revived)
            s3.create_bucket(Bucket=bucket)
            print(f"S3 was down {time.monotonic() - went_down:.1f}s")
            try:
                s3.list_parts(Bucket=bucket, Key=key, UploadId=first_upload)
                raise AssertionError("the revived endpoint still knows the first upload")
            except ClientError as e:
                assert e.response["Error"]["Code"] == "NoSuchUpload", e.response

            result_task = asyncio.ensure_future(handle.result())
            new_uploads: set[str] = set()
            try:
                while not result_task.done():
                    assert loop.time() < deadline, "the lifecycle did not finish"
                    _, beat = await upload_heartbeat(client, handle)
                    if beat.get("upload_id") and beat["upload_id"] != first_upload:
                        new_uploads.add(str(beat["upload_id"]))
                    await asyncio.wait({result_task}, timeout=POLL)
                result = result_task.result()
            finally:
                result_task.cancel()

        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ]
        # The exact bytes, and S3's own whole-object CRC32C is the registered one.
        obj = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert obj["Body"].read() == data
        assert obj.get("ChecksumCRC32C") == crc32c_to_base64(int(crc_hex(data), 16))
        # No upload left on the endpoint, neither the retries' nor anyone's.
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        # The retry that finished was handed the lost upload's resume point and began anew.
        assert new_uploads, "no retry was seen uploading under a new upload id"
        with engine.connect() as conn:
            copied = [
                d
                for (d,) in conn.execute(
                    select(Event.detail)
                    .where(Event.checkpoint_id == cp, Event.kind == "copied", Event.tier == "s3")
                    .order_by(Event.id)
                )
            ]
        assert len(copied) == 1, copied
        assert copied[0]["attempt"] >= 2
        resumed = copied[0]["resumed"]
        assert [r["path"] for r in resumed] == [SHARD], copied[0]
        assert resume_offset <= resumed[0]["offset"] < SHARD_SIZE, copied[0]

        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("s3 fault test ended")
        for server in (moto, revived):
            if server is not None:
                await asyncio.to_thread(server.stop)
        engine.dispose()
