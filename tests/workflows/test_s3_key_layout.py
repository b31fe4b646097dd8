"""A checkpoint written to S3 with spread keys (`key_layout = "spread"`), then the tier's setting
changed back to flat: the old checkpoint is still found everywhere by the layout the catalog
recorded for it. The restore plan hands its spread keys and the client restores the bytes; an
operator's verification reads them back and finds a flipped one, which repair writes again at its
spread key; reconciliation finds nothing missing or extra; retention expires it and deletes its
objects. The next checkpoint is flat. On the real stack: Temporal, Postgres, moto, real workers.

The expected keys are restated here from the documented rule, not taken from the code under test.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.models import LatestCheckpoint, TierInfo
from tierpoint_client.restore import restore_plan

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import OVERALL_TIMEOUT, marker_states
from tests.helpers.integrity import integrity_settings, repair_result, run_reconcile
from tests.helpers.lifecycle import Seeded, running_workers
from tests.helpers.retention import create_job, set_policy, settle, write_checkpoint
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.models import TierCopy
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.integrity import (
    VERIFY_CHECKPOINT_WORKFLOW,
    ReconcileInput,
    VerifyCheckpointInput,
    VerifyOutcome,
    verify_checkpoint_workflow_id,
)
from tierpoint.tier_config import KeyLayoutKind, TierKind

PREFIXES = 8


def _with_s3(settings: Settings, **s3: Any) -> Settings:
    cfg = integrity_settings(settings)
    tiers = [t.model_copy(update=s3) if t.kind is TierKind.S3 else t for t in cfg.tiers]
    return cfg.model_copy(update={"tiers": tiers})


def _spread_key(prefix: str, job: str, step: int, path: str) -> str:
    h = int.from_bytes(hashlib.sha256(f"{job}/{step}/{path}".encode()).digest()[:8], "big")
    return f"{prefix}_{h % PREFIXES:x}/{job}/{step}/{path}"


def _layout(engine: Engine, checkpoint_id: int) -> str | None:
    with engine.connect() as conn:
        return conn.scalar(
            select(TierCopy.key_layout).where(
                TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == "s3"
            )
        )


def _keys(s3: Any, bucket: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


async def _restore(
    cfg: Settings, job: str, dest: Path
) -> tuple[LatestCheckpoint, list[Any], dict[str, str]]:
    """The latest restorable on s3 restored by the client into `dest`, and the checkpoint's page
    (each shard's key on s3)."""
    async for api in running_client(create_app(cfg)):
        r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
        assert r.status_code == 200, r.text
        tiers = {t["name"]: TierInfo.from_json(t) for t in (await api.get("/v1/tiers")).json()}
        latest = LatestCheckpoint.from_json(r.json())
        files = (await asyncio.to_thread(restore_plan, latest.plan, dest, tiers, workers=4)).files
        page = (await api.get(f"/v1/jobs/{job}/checkpoints/{latest.step}")).json()
        keys = {
            sh["path"]: r["key"]
            for sh in page["shards"]
            for r in sh["replicas"]
            if r["tier"] == "s3"
        }
        return latest, files, keys
    raise AssertionError("the API did not start")


async def _verify(cfg: Settings, client: Client, seeded: Seeded) -> VerifyOutcome:
    handle = await client.start_workflow(
        VERIFY_CHECKPOINT_WORKFLOW,
        VerifyCheckpointInput(checkpoint_id=seeded.checkpoint_id, tier="s3", kind=TierKind.S3),
        id=verify_checkpoint_workflow_id(seeded.job, seeded.step, "s3"),
        task_queue=SHARED_TASK_QUEUE,
        result_type=VerifyOutcome,
    )
    return await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)


async def test_spread_checkpoint_outlives_a_change_of_the_setting(
    settings: Settings,
    sessions: sessionmaker[Session],
    engine: Engine,
    client: Client,
    services: Services,
    tmp_path: Path,
) -> None:
    spread = _with_s3(settings, key_layout=KeyLayoutKind.SPREAD, key_prefixes=PREFIXES)
    flat = _with_s3(settings)
    tier = flat.tier("s3")
    assert tier.bucket is not None and tier.key_layout == "flat"
    job = f"layout-{uuid.uuid4().hex[:10]}"
    policy = create_job(sessions, job, {"tiers": {}})
    s3 = s3_client(services)

    async with running_workers(spread, client):
        first, _ = await write_checkpoint(spread, sessions, client, job, 1, per_node=4, size=9000)
    assert _layout(engine, first.checkpoint_id) == f"spread-{PREFIXES}"
    expected = {sh.path: _spread_key(tier.prefix, job, 1, sh.path) for sh in first.shards}
    assert len({k.split("/")[0] for k in expected.values()}) > 1  # more than one prefix
    stored = _keys(s3, tier.bucket)
    assert set(expected.values()) <= stored
    assert not any(k.startswith(f"{tier.prefix}{job}/") for k in stored)  # nothing flat
    for sh in first.shards:
        body = s3.get_object(Bucket=tier.bucket, Key=expected[sh.path])["Body"].read()
        assert body == sh.data, sh.path
    checked = assert_catalog_matches_tiers(flat, engine, [first.checkpoint_id])
    assert checked.verified["s3"] == 8 and checked.restorable["s3"] == 1, checked

    # From here on the tier's setting is flat: everything must still find the spread objects.
    async with running_workers(flat, client):
        latest, files, shown = await _restore(flat, job, tmp_path / "restored")
        assert latest.step == 1
        assert {e.path: e.key for e in latest.plan} == expected == shown
        assert sorted(f.path for f in files) == sorted(expected)
        for sh in first.shards:
            assert (tmp_path / "restored" / sh.path).read_bytes() == sh.data, sh.path

        bad = first.shards[0]
        data = bytearray(bad.data)
        data[100] ^= 0x01
        s3.put_object(Bucket=tier.bucket, Key=expected[bad.path], Body=bytes(data))
        out = await _verify(flat, client, first)
        assert (out.read, out.good, out.corrupt, out.lost) == (8, 7, 1, 0), out
        assert out.repair_requested, out
        await repair_result(client, first)
        assert marker_states(engine, first.checkpoint_id)["s3"] == "restorable"
        again = s3.get_object(Bucket=tier.bucket, Key=expected[bad.path])["Body"].read()
        assert again == bad.data
        assert assert_catalog_matches_tiers(flat, engine, [first.checkpoint_id]).verified["s3"] == 8

        report = await run_reconcile(
            client, f"reconcile-layout/{job}", ReconcileInput(tier="s3", job=job)
        )
        (s3_report,) = report.tiers
        assert s3_report.counts == {} and s3_report.checked == 8, s3_report
        # The whole bucket (other tests' objects may be in it): the spread directories are not
        # taken for jobs, and nothing of this job is missing or extra.
        report = await run_reconcile(client, f"reconcile-all/{job}", ReconcileInput(tier="s3"))
        (s3_report,) = report.tiers
        found = [e for ex in s3_report.examples.values() for e in ex]
        assert "missing" not in s3_report.counts, s3_report
        assert not [e for e in found if e.startswith(("_", job))], s3_report

        # Keep one copy on S3: the next (flat) checkpoint expires the spread one.
        set_policy(sessions, policy, {"tiers": {"s3": {"keep_last": 1}}})
        second, _ = await write_checkpoint(flat, sessions, client, job, 2, per_node=4, size=9000)
        outcome = await settle(client, job)
        assert outcome.failed == 0, outcome
    assert _layout(engine, second.checkpoint_id) == "flat"
    assert marker_states(engine, first.checkpoint_id)["s3"] == "expired"
    stored = _keys(s3, tier.bucket)
    assert not set(expected.values()) & stored
    assert {f"{tier.prefix}{job}/2/{sh.path}" for sh in second.shards} <= stored
    assert assert_catalog_matches_tiers(flat, engine, [second.checkpoint_id]).verified["s3"] == 8
