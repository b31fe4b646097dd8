"""The worker process that uploads to S3 (the node's: copies fan out from its local copy, ssd ->
s3) SIGKILLed in the middle of a multipart upload loses nothing: a new worker process for the node
resumes the same upload from the killed attempt's last heartbeat, sends only the parts that were
not finished, completes that upload id, and leaves no other upload behind; every tier ends
restorable with the original bytes. The workflows run on a shared worker that lives on.

The same fault mid-copy to the shared tier is test_worker_killed.py. What S3 received is read
from the endpoint itself: moto's request log lists every request it answered, with its upload id
and part number.

By construction, not by timing: six 5 MiB parts read off the node's ssd at 6 MB/s by the first
worker, shared with its copy to lustre while both run (a part every ~1.7 s); the kill waits until
the catalog shows the upload under way and the Temporal server holds its upload id and an offset,
and fails saying so if the upload was too far along by then. The second worker reads at full
speed."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import select
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from apps.devstack.services import MotoS3Server
from tests.helpers.consistency import assert_nothing_lost
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    s3_client_for,
    s3_replica,
    s3_requests,
    slow_upload,
    upload_under_way,
)
from tests.helpers.lifecycle import NODES, running_workers
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Event
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

PART = 5 * 1024 * 1024
SHARD = "big.bin"
SHARD_SIZE = 6 * PART
# Shared by the node's two copies off its ssd (to lustre and to s3) while both run: each keeps a
# heartbeat per 8 MiB chunk well inside HEARTBEAT_TIMEOUT.
READ_LIMIT = 6_000_000
# How long Temporal waits for the dead worker's heartbeat before handing the attempt on; the
# worker heartbeats every tenth of it.
HEARTBEAT_TIMEOUT = 8.0
TOO_LATE = "the upload was nearly done before the worker could be killed: slow it (READ_LIMIT)"


async def test_uploading_worker_sigkilled_mid_multipart_upload_resumes_same_upload(
    settings: Settings, tmp_path: Path
) -> None:
    bucket = f"tp-fault-{uuid.uuid4().hex[:12]}"
    moto = MotoS3Server()
    moto_log = tmp_path / "moto.log"
    await asyncio.to_thread(moto.start, moto_log)
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
            step=6,
            path=SHARD,
            size=SHARD_SIZE,
            part_size=PART,
            read_limit=READ_LIMIT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
        )
        cfg, node_cfg, data, key = up.cfg, up.node_cfg, up.data, up.key
        job, step, cp = up.job, up.step, up.checkpoint_id
        handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
        deadline = asyncio.get_running_loop().time() + OVERALL_TIMEOUT

        async with running_workers(cfg, client, nodes=[], shared=True):
            with worker_process(node_cfg, NODES[0], tmp_path / "node-1.log") as first:
                await start_lifecycle(client, LifecycleInput(checkpoint_id=cp, job=job, step=step))
                upload_id, offset = await upload_under_way(
                    client, handle, engine, cp, deadline=deadline, too_late=TOO_LATE
                )
                assert offset % PART == 0 and offset <= SHARD_SIZE - 2 * PART, TOO_LATE
                assert first.alive(), first.output()
                status = first.kill()
            assert status == -9, first.output()
            finished = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)["Parts"]
            state, done = await asyncio.to_thread(s3_replica, engine, cp)
            assert state == "copying" and done < SHARD_SIZE, f"{TOO_LATE} ({state}, {done})"
            assert len(finished) >= offset // PART, finished

            with worker_process(cfg, NODES[0], tmp_path / "node-2.log") as second:
                result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
                assert second.alive(), second.output()

        assert [(t.tier, t.state) for t in result.tiers] == [
            ("ssd", "restorable"),
            ("lustre", "restorable"),
            ("s3", "restorable"),
        ]
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

        # What the endpoint saw: one upload created, its parts sent once each (bar the one in
        # flight at the kill), and that same upload id completed.
        log = [r for r in s3_requests(moto_log) if r.path == f"/{bucket}/{key}"]
        created = [r for r in log if r.method == "POST" and "uploads" in r.query]
        assert len(created) == 1 and created[0].status == 200, created
        parts = [r for r in log if r.method == "PUT" and "partNumber" in r.query]
        assert {r.query["uploadId"] for r in parts} == {upload_id}
        sent = Counter(int(r.query["partNumber"]) for r in parts if r.status == 200)
        assert sorted(sent) == list(range(1, SHARD_SIZE // PART + 1)), sent
        for part in finished:
            assert sent[part["PartNumber"]] == 1, f"part {part['PartNumber']} sent again: {sent}"
        resent = [n for n, c in sent.items() if c > 1]
        assert len(resent) <= 1, f"more than the part in flight was sent again: {sent}"
        completed = [r for r in log if r.method == "POST" and "uploadId" in r.query]
        assert [(r.query["uploadId"], r.status) for r in completed] == [(upload_id, 200)]

        with engine.connect() as conn:
            copied = [
                d
                for (d,) in conn.execute(
                    select(Event.detail)
                    .where(Event.checkpoint_id == cp, Event.kind == "copied", Event.tier == "s3")
                    .order_by(Event.id)
                )
            ]
        assert len(copied) == 1 and copied[0]["attempt"] >= 2, copied
        assert [r["path"] for r in copied[0]["resumed"]] == [SHARD], copied
        assert offset <= copied[0]["resumed"][0]["offset"] < SHARD_SIZE, copied
        print(
            f"killed at heartbeat offset {offset} with {len(finished)} parts finished; "
            f"resumed at {copied[0]['resumed'][0]['offset']}; parts sent {dict(sent)}"
        )

        checked = assert_nothing_lost(cfg, engine, {cp: ("ssd", "lustre", "s3")})
        assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("fault test ended")
        await asyncio.to_thread(moto.stop)
        engine.dispose()
