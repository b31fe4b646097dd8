"""The S3 endpoint is unreachable (connection refused) from before a checkpoint's lifecycle
starts: ssd and lustre become restorable without it, the copies to s3 fail and are retried, nothing
is reported restorable on s3 while it is down (the API's latest-on-s3 is a 404 problem, the restore
plan names lustre only, readiness names the s3 tier), and once an empty endpoint answers on the
same address the lifecycle finishes on its own with the right bytes in the bucket and the catalog
agreeing with every tier.

The shards are small single PUTs and no upload is interrupted mid-copy: that is
test_s3_outage_mid_upload.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

from sqlalchemy.orm import sessionmaker
from temporalio.client import WorkflowExecutionStatus

from api.app import create_app
from apps.devstack.services import MotoS3Server
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    eventually,
    marker_states,
    s3_client_for,
    wait_for_retry,
)
from tests.helpers.lifecycle import (
    NODES,
    new_job,
    random_shards,
    running_workers,
    seed_checkpoint,
)
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import COPY_BATCH, LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

PROBLEM = "application/problem+json"
# How long S3 stays down at least: a few retries of the copy (1 s, 2 s, 4 s backoff, each attempt
# with botocore's own retries) fall inside it, and the next one comes within seconds of its return.
OUTAGE_SECONDS = 6.0


async def test_s3_unreachable_before_s3_stage_blocks_only_s3_and_recovers(
    settings: Settings, tmp_path: Path
) -> None:
    bucket = f"tp-fault-{uuid.uuid4().hex[:12]}"
    moto = MotoS3Server()
    await asyncio.to_thread(moto.start, tmp_path / "moto-1.log")
    revived: MotoS3Server | None = None
    engine = make_sync_engine(settings.database_url, pool_size=2)
    client = await connect(settings)
    seeded = None
    try:
        s3_client_for(moto).create_bucket(Bucket=bucket)
        s3_tier = settings.tier("s3").model_copy(
            update={"bucket": bucket, "endpoint_url": moto.endpoint_url}
        )
        cfg = settings.model_copy(
            update={"tiers": [t if t.name != "s3" else s3_tier for t in settings.tiers]}
        )
        shards = random_shards(NODES, 2, 200_000)
        seeded = seed_checkpoint(cfg, sessionmaker(engine), new_job(), 3, shards)
        job, step = seeded.job, seeded.step
        handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)

        async def restorable_on(tier: str) -> bool:
            states = await asyncio.to_thread(marker_states, engine, seeded.checkpoint_id)
            return states.get(tier) == "restorable"

        async for api in running_client(create_app(cfg)):
            async with running_workers(cfg, client):
                # Down before the lifecycle starts: ssd and lustre need no S3, the s3 stage does.
                await asyncio.to_thread(moto.stop)
                went_down = time.monotonic()
                await start_lifecycle(
                    client,
                    LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step),
                )
                await eventually("lustre restorable", lambda: restorable_on("lustre"))
                failure = await wait_for_retry(handle, COPY_BATCH)
                print(f"copy to s3 while down: {failure}")

                # While S3 is down nothing is restorable there, and readiness names it.
                states = await asyncio.to_thread(marker_states, engine, seeded.checkpoint_id)
                assert states["ssd"] == states["lustre"] == "restorable"
                assert states["s3"] != "restorable"
                r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
                assert r.status_code == 404, r.text
                assert r.headers["content-type"] == PROBLEM
                assert r.json()["code"] == "no_restorable_checkpoint"
                r = await api.get(f"/v1/jobs/{job}/checkpoints/latest")
                assert r.status_code == 200, r.text
                assert {e["tier"] for e in r.json()["plan"]} == {"lustre"}
                r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}")
                assert {t["tier"]: t["state"] for t in r.json()["tiers"]}["s3"] != "restorable"
                r = await api.get("/readyz")
                assert r.status_code == 503, r.text
                assert r.headers["content-type"] == PROBLEM
                problem = r.json()
                assert problem["code"] == "not_ready"
                assert problem["checks"]["catalog"] == "ok"
                assert problem["checks"]["tier:s3"] != "ok"
                assert "tier:s3" in problem["detail"]

                # S3 comes back on the same address, empty (moto keeps nothing).
                await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - went_down)))
                revived = MotoS3Server(port=moto.port)
                await asyncio.to_thread(revived.start, tmp_path / "moto-2.log")
                s3_client_for(revived).create_bucket(Bucket=bucket)
                back = time.monotonic()
                print(f"S3 was down {back - went_down:.1f}s")
                result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
                print(f"finished {time.monotonic() - back:.1f}s after S3 came back")

            assert [(t.tier, t.state) for t in result.tiers] == [
                ("ssd", "restorable"),
                ("lustre", "restorable"),
                ("s3", "restorable"),
            ]
            assert await restorable_on("s3")
            s3 = s3_client_for(revived)
            for sh in shards:
                key = f"{s3_tier.prefix}{job}/{step}/{sh.path}"
                body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                assert body == sh.data, f"s3: {sh.path}"
            r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
            assert r.status_code == 200, r.text
            latest = r.json()
            assert latest["step"] == step
            assert sorted(e["path"] for e in latest["plan"]) == sorted(s.path for s in shards)
            assert {e["tier"] for e in latest["plan"]} == {"s3"}
            assert (await api.get("/readyz")).status_code == 200
        checked = assert_catalog_matches_tiers(cfg, engine, [seeded.checkpoint_id])
        assert checked.verified == {"ssd": len(shards), "lustre": len(shards), "s3": len(shards)}
        assert checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
    finally:
        if seeded is not None:
            handle = client.get_workflow_handle(workflow_id(seeded.job, seeded.step))
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("s3 fault test ended")
        for server in (moto, revived):
            if server is not None:
                await asyncio.to_thread(server.stop)
        engine.dispose()
