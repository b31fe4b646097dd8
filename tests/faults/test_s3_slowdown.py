"""S3 answers 503 SlowDown to part of the requests, as it does when many nodes write or read one
prefix at once: in the middle of the uploads of a checkpoint's lifecycle (single PUTs, a
multipart upload and the verifications after them) and in the middle of a restore by the client.
Both go through the shaping proxy (tests/helpers/s3_proxy.py) in front of the session's S3
endpoint; both finish by backing off and retrying, every shard verified on every tier, the bytes
in the bucket and the restored files equal to the registered ones.

By construction, not by timing: a storm refuses every other request from its first one, and it
ends for the uploads only once the proxy has refused uploads and let others through; the restore
runs entirely inside a storm."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio.client import WorkflowExecutionStatus
from tierpoint_client.models import LatestCheckpoint, TierInfo
from tierpoint_client.restore import restore_plan

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import OVERALL_TIMEOUT, eventually
from tests.helpers.lifecycle import (
    NODES,
    ShardSpec,
    crc_hex,
    new_job,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.s3_proxy import shaping_proxy
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

MIB = 1024 * 1024
# Long enough to outlast what it is meant for; ended by the test or by the restore's end.
STORM = 3600.0


def _shards() -> list[ShardSpec]:
    # Small single PUTs on both nodes, and one multipart upload (two 5 MiB parts).
    sizes = {"a.bin": 64 * 1024, "b.bin": 96 * 1024, "c.bin": 32 * 1024}
    shards = []
    for node in NODES:
        for name, size in sizes.items():
            data = os.urandom(size)
            shards.append(ShardSpec(node, f"{node}-{name}", data, crc_hex(data)))
    big = os.urandom(10 * MIB)
    return [*shards, ShardSpec(NODES[0], "big.bin", big, crc_hex(big))]


async def test_slowdown_storm_mid_upload_and_mid_restore_loses_nothing(
    settings: Settings, services: Services, tmp_path: Path
) -> None:
    tier = settings.tier("s3")
    assert tier.endpoint_url and tier.bucket
    engine = make_sync_engine(settings.database_url, pool_size=2)
    client = await connect(settings)
    job = None
    try:
        with shaping_proxy(tier.endpoint_url) as proxy:
            s3_tier = tier.model_copy(
                update={"endpoint_url": proxy.endpoint_url, "multipart_part_size": 5 * MIB}
            )
            cfg = settings.model_copy(
                update={"tiers": [t if t.name != "s3" else s3_tier for t in settings.tiers]}
            )
            shards = _shards()
            seeded = seed_checkpoint(cfg, sessionmaker(engine), new_job(), 7, shards)
            job, step = seeded.job, seeded.step
            handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)

            async def uploads_refused_and_passed() -> bool:
                st = await asyncio.to_thread(proxy.stats)
                return bool(st["slowdown_storm"] >= 3 and st["forwarded_by_method"].get("PUT", 0))

            async with running_workers(cfg, client):
                await asyncio.to_thread(proxy.storm, 0.5, STORM)
                await start_lifecycle(
                    client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step)
                )
                await eventually(
                    "requests refused and uploads let through", uploads_refused_and_passed
                )
                during = await asyncio.to_thread(proxy.storm, 0.0, 0.0)
                print(f"storm over uploads: {during}")
                t0 = time.monotonic()
                result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
                print(f"lifecycle done {time.monotonic() - t0:.1f}s after the storm")

            assert [(t.tier, t.state) for t in result.tiers] == [
                ("ssd", "restorable"),
                ("lustre", "restorable"),
                ("s3", "restorable"),
            ]
            writes = ("PUT", "POST")
            assert sum(during["slowdown_by_method"].get(m, 0) for m in writes) >= 1, during
            checked = assert_catalog_matches_tiers(cfg, engine, [seeded.checkpoint_id])
            n = len(shards)
            assert checked.verified == {"ssd": n, "lustre": n, "s3": n}
            direct = s3_client(services)
            for sh in shards:
                key = f"{s3_tier.prefix}{job}/{step}/{sh.path}"
                body = direct.get_object(Bucket=tier.bucket, Key=key)["Body"].read()
                assert body == sh.data, f"s3: {sh.path}"

            latest, tiers = await _plan(cfg, job)
            assert {e.tier for e in latest.plan} == {"s3"}
            before = await asyncio.to_thread(proxy.stats)
            await asyncio.to_thread(proxy.storm, 0.5, STORM)
            restored = await asyncio.to_thread(
                restore_plan, latest.plan, tmp_path / "restored", tiers, workers=4
            )
            files = restored.files
            after = await asyncio.to_thread(proxy.storm, 0.0, 0.0)
            print(f"storm over the restore: {after}")

        refused = after["slowdown_by_method"].get("GET", 0)
        refused -= before["slowdown_by_method"].get("GET", 0)
        assert refused >= 1, (before, after)
        assert sorted(f.path for f in files) == sorted(sh.path for sh in shards)
        for sh in shards:
            assert (tmp_path / "restored" / sh.path).read_bytes() == sh.data, sh.path
    finally:
        if job is not None:
            handle = client.get_workflow_handle(workflow_id(job, 7))
            with contextlib.suppress(Exception):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("slowdown fault test ended")
        engine.dispose()


async def _plan(cfg: Settings, job: str) -> tuple[LatestCheckpoint, dict[str, TierInfo]]:
    """The restore plan of the job's latest checkpoint on s3 and the tiers, from the API."""
    async for api in running_client(create_app(cfg)):
        r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
        assert r.status_code == 200, r.text
        tiers: list[dict[str, Any]] = (await api.get("/v1/tiers")).json()
        return LatestCheckpoint.from_json(r.json()), {
            t["name"]: TierInfo.from_json(t) for t in tiers
        }
    raise AssertionError("the API did not start")
