"""The catalog's Postgres is down when a checkpoint's lifecycle starts, and goes down again once
the ssd tier is promoted: the workflow waits both outages out (its plan activity is seen failing and
retried during the first) and finishes with every tier restorable, the right bytes and the catalog
agreeing with every tier; the API refuses a registration meanwhile with a 503 catalog_unavailable
problem, writes nothing of it, and accepts the same registration once the catalog is back.

Neither outage is timed to land on a running batch activity: that is
test_postgres_outage_mid_copy.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus

from api.app import create_app
from apps.devstack.services import EmbeddedPostgres
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    activity_errors,
    db_now,
    eventually,
    make_tier_dirs,
    marker_states,
    workers_reported_in,
)
from tests.helpers.lifecycle import (
    NODES,
    ShardSpec,
    crc_hex,
    new_job,
    random_shards,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.services import Services, make_bucket, make_settings, s3_client
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Replica
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import PLAN, LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import connect, start_lifecycle

PROBLEM = "application/problem+json"
# How long the catalog stays down at least: several retries of the catalog activities (1 s, 2 s,
# 4 s backoff) fall inside it, and the next one comes within seconds of its return.
OUTAGE_SECONDS = 6.0
SECOND_OUTAGE_SECONDS = 4.0
TIERS = ["ssd", "lustre", "s3"]


def write_local(settings: Settings, job: str, step: int, shards: list[ShardSpec]) -> None:
    local = settings.local_tier()
    assert local is not None
    for sh in shards:
        f = local.root_for(sh.node) / job / str(step) / sh.path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(sh.data)


def manifest(step: int, shards: list[ShardSpec]) -> dict[str, Any]:
    return {
        "step": step,
        "shards": [
            {"path": s.path, "size": len(s.data), "crc32c": crc_hex(s.data), "node": s.node}
            for s in shards
        ],
        "metadata": {"fault": "postgres"},
    }


def assert_bytes(
    settings: Settings, services: Services, job: str, step: int, shards: list[ShardSpec]
) -> None:
    s3_tier = settings.tier("s3")
    assert s3_tier.bucket is not None
    s3 = s3_client(services)
    for sh in shards:
        for tier, node in (("ssd", sh.node), ("lustre", None)):
            f = shard_file(settings, tier, node, job, step, sh.path)
            assert f.read_bytes() == sh.data, f"{tier}: {sh.path}"
        key = f"{s3_tier.prefix}{job}/{step}/{sh.path}"
        assert s3.get_object(Bucket=s3_tier.bucket, Key=key)["Body"].read() == sh.data


async def finish(client: Client, job: str, step: int) -> LifecycleResult:
    handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
    result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
    assert isinstance(result, LifecycleResult)
    return result


async def test_postgres_down_at_start_and_after_ssd_promotion_loses_nothing(
    dedicated_postgres: EmbeddedPostgres,
    services: Services,
    temporal_namespace: str,
    tmp_path: Path,
) -> None:
    pg = dedicated_postgres
    url = pg.url
    make_tier_dirs(tmp_path)
    cfg = make_settings(services, url, tmp_path, make_bucket(services), temporal_namespace)
    engine = make_sync_engine(url, pool_size=2)
    client = await connect(cfg)
    job = new_job()
    first = random_shards(NODES, 2, 200_000)
    second = random_shards(NODES, 1, 150_000)
    write_local(cfg, job, 2, second)
    register = f"/v1/jobs/{job}/checkpoints"
    try:
        seeded = seed_checkpoint(cfg, sessionmaker(engine), job, 1, first)
        async for api in running_client(create_app(cfg)):
            since = await asyncio.to_thread(db_now, engine)
            async with running_workers(cfg, client):
                await workers_reported_in(engine, NODES, since)
                await asyncio.to_thread(pg.stop)
                went_down = time.monotonic()
                failed_before = activity_errors(PLAN)
                await start_lifecycle(
                    client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=1)
                )

                async def plan_failed(before: float = failed_before) -> bool:
                    return activity_errors(PLAN) > before

                # The plan is a local activity: it fails and retries inside the shared worker.
                await eventually("the plan failed while the catalog is down", plan_failed)

                r = await api.post(register, json=manifest(2, second))
                assert r.status_code == 503, r.text
                assert r.headers["content-type"] == PROBLEM
                problem = r.json()
                assert problem["code"] == "catalog_unavailable"
                assert problem["status"] == 503
                assert "Traceback" not in r.text
                r = await api.get("/readyz")
                assert r.status_code == 503
                assert r.json()["checks"]["catalog"] != "ok"

                await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - went_down)))
                await asyncio.to_thread(pg.start)
                back = time.monotonic()
                print(f"catalog was down {back - went_down:.1f}s")
                assert pg.url == url

                # A second outage in the middle: once the ssd copy is promoted, the copies to
                # lustre and s3 and their promotions still need the catalog.
                async def ssd_restorable() -> bool:
                    states = await asyncio.to_thread(marker_states, engine, seeded.checkpoint_id)
                    return states.get("ssd") == "restorable"

                await eventually("ssd restorable", ssd_restorable)
                await asyncio.to_thread(pg.stop)
                await asyncio.sleep(SECOND_OUTAGE_SECONDS)
                await asyncio.to_thread(pg.start)
                back = time.monotonic()
                result = await finish(client, job, 1)
                print(f"step 1 finished {time.monotonic() - back:.1f}s after the catalog returned")

                # Nothing of the refused registration reached the catalog: this one creates it.
                r = await api.post(register, json=manifest(2, second))
                assert r.status_code == 201, r.text
                assert r.json()["shard_count"] == len(second)
                again = await finish(client, job, 2)

            for res in (result, again):
                assert [(t.tier, t.state) for t in res.tiers] == [(t, "restorable") for t in TIERS]
            for step, shards in ((1, first), (2, second)):
                r = await api.get(f"{register}/{step}")
                assert r.status_code == 200, r.text
                body = r.json()
                assert {t["tier"]: t["state"] for t in body["tiers"]} == dict.fromkeys(
                    TIERS, "restorable"
                )
                replicas = [rep for sh in body["shards"] for rep in sh["replicas"]]
                assert len(replicas) == len(TIERS) * len(shards)
                assert {rep["state"] for rep in replicas} == {"verified"}
                assert_bytes(cfg, services, job, step, shards)
            r = await api.get(f"{register}/latest", params={"tier": "s3"})
            assert r.status_code == 200 and r.json()["step"] == 2
        with engine.connect() as conn:
            total = conn.scalar(select(func.count()).select_from(Replica))
        assert total == len(TIERS) * (len(first) + len(second))
        checked = assert_catalog_matches_tiers(
            cfg, engine, [seeded.checkpoint_id, again.checkpoint_id]
        )
        n = len(first) + len(second)
        assert checked.verified == dict.fromkeys(TIERS, n)
        assert checked.restorable == dict.fromkeys(TIERS, 2)
    finally:
        # A lifecycle of this catalog must not outlive it: later workers would look for it in
        # another catalog.
        for step in (1, 2):
            h = client.get_workflow_handle(workflow_id(job, step))
            with contextlib.suppress(Exception):
                if (await h.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await h.terminate("postgres fault test ended")
        engine.dispose()
