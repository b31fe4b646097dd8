"""S3 objects deleted behind tierpoint's back: reconciliation lists the bucket, reports the
missing objects, and with repair marks their replicas lost and demotes s3 in the same transaction
(latest restorable stops offering it); repair copies them back from a tier that still holds them
verified and s3 is restorable again. Abandoned temp files and multipart uploads are reported and,
with repair, removed; files and objects the catalog does not know are reported and never deleted.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import OVERALL_TIMEOUT, marker_states
from tests.helpers.integrity import (
    events,
    integrity_settings,
    promoted,
    repair_result,
    replica_states,
    run_reconcile,
    s3_key,
)
from tests.helpers.lifecycle import (
    record_history,
    recording_histories,
    running_workers,
    shard_file,
)
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileInput
from tierpoint.storage.paths import partial_name


async def test_deleted_s3_objects_are_reported_marked_lost_and_copied_back(
    settings: Settings, services: Services, client: Client
) -> None:
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine)
        job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
        s3 = s3_client(services)
        bucket = cfg.tier("s3").bucket
        gone = seeded.shards[:3]
        for sh in gone:
            s3.delete_object(Bucket=bucket, Key=s3_key(cfg, seeded, sh))

        async for api in running_client(create_app(cfg)):
            async with running_workers(cfg, client, nodes=()):
                # Without repair: reported, nothing changes.
                report = await run_reconcile(
                    client, f"reconcile-test/{job}/report", ReconcileInput(tier="s3")
                )
                (s3_report,) = report.tiers
                assert s3_report.counts == {"missing": 3}, s3_report
                assert sorted(s3_report.examples["missing"]) == sorted(
                    f"{job}/{step}/{sh.path}" for sh in gone
                )
                assert s3_report.marked == 0
                assert marker_states(engine, cp)["s3"] == "restorable"

                report = await run_reconcile(
                    client, f"reconcile-test/{job}/repair", ReconcileInput(tier="s3", repair=True)
                )
                if recording_histories():
                    await record_history(client, f"reconcile-test/{job}/repair", "reconcile_s3")
                (s3_report,) = report.tiers
                assert s3_report.marked == 3 and s3_report.damaged == [cp], s3_report
                assert report.repairs_requested == 1
                assert marker_states(engine, cp)["s3"] == "failed"
                replicas = replica_states(engine, cp)
                assert [replicas[("s3", sh.path)] for sh in gone] == ["lost"] * 3
                r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
                assert r.status_code == 404, r.text
                r = await api.get(f"/v1/jobs/{job}/checkpoints/latest")
                assert {e["tier"] for e in r.json()["plan"]} == {"lustre"}
                (lost,) = events(engine, cp, "lost")
                assert lost[1] == "s3" and lost[2]["count"] == 3 and lost[2]["marker_demoted"]

            async with running_workers(cfg, client):
                repaired = await repair_result(client, seeded)
            assert {t.tier: t.state for t in repaired.tiers} == {"s3": "restorable"}, repaired
            for sh in gone:
                body = s3.get_object(Bucket=bucket, Key=s3_key(cfg, seeded, sh))["Body"].read()
                assert body == sh.data
            r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
            assert r.status_code == 200, r.text
            sources = [d["sources"] for _, _, d in events(engine, cp, "repaired")]
            assert sum(n for s in sources for n in s.values()) == 3, sources
            assert {t for s in sources for t in s} <= {"ssd", "lustre"}
        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.restorable == dict.fromkeys(("ssd", "lustre", "s3"), 1)
        assert checked.verified["s3"] == len(seeded.shards)
    finally:
        engine.dispose()


async def _reconcile_through_api(api: httpx.AsyncClient, body: dict[str, object]) -> dict[str, Any]:
    r = await api.post("/v1/reconcile", json=body)
    assert r.status_code == 202, r.text
    run = r.json()["id"]
    deadline = time.monotonic() + OVERALL_TIMEOUT
    while True:
        r = await api.get(f"/v1/reconcile/{run}")
        assert r.status_code == 200, r.text
        if r.json()["status"] == "completed":
            report: dict[str, Any] = r.json()["report"]
            return report
        assert time.monotonic() < deadline, r.text
        await asyncio.sleep(0.3)


async def test_abandoned_copies_are_cleaned_and_unknown_bytes_only_reported(
    settings: Settings, services: Services, client: Client
) -> None:
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine, per_node=1)
        job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
        s3 = s3_client(services)
        bucket = cfg.tier("s3").bucket
        prefix = cfg.tier("s3").prefix
        # An abandoned multipart upload and a copy's temp file left by a dead worker.
        upload = s3.create_multipart_upload(
            Bucket=bucket, Key=f"{prefix}{job}/{step}/half.bin", ChecksumAlgorithm="CRC32C"
        )["UploadId"]
        s3.upload_part(
            Bucket=bucket,
            Key=f"{prefix}{job}/{step}/half.bin",
            UploadId=upload,
            PartNumber=1,
            Body=os.urandom(1000),
        )
        first = seeded.shards[0]
        lustre_file = shard_file(cfg, "lustre", None, job, step, first.path)
        temp = lustre_file.with_name(partial_name("other.bin"))
        temp.write_bytes(b"half a copy")
        # Bytes nobody registered: reported, never deleted.
        s3.put_object(Bucket=bucket, Key=f"{prefix}{job}/{step}/stray.bin", Body=b"x")
        s3.put_object(Bucket=bucket, Key=f"{prefix}nobody/1/a.bin", Body=b"y")
        stray = lustre_file.with_name("stray.bin")
        stray.write_bytes(b"z")

        async for api in running_client(create_app(cfg)):
            async with running_workers(cfg, client):
                # Every job: the catalog's other jobs (earlier tests of this module, other buckets
                # and roots) are missing here, so only what this test made is asserted exactly.
                dry = await _reconcile_through_api(api, {})
                by_tier = {(t["tier"], t["node"]): t for t in dry["tiers"]}
                s3_rep = by_tier[("s3", None)]
                assert s3_rep["counts"]["abandoned_upload"] == 1, s3_rep
                assert "nobody (not a job of the catalog)" in s3_rep["examples"]["extra"]
                assert f"{job}/{step}/stray.bin" in s3_rep["examples"]["extra"]
                assert all(t["cleaned"] == 0 and t["marked"] == 0 for t in dry["tiers"])
                assert temp.exists()
                assert s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads")

                fixed = await _reconcile_through_api(api, {"job": job, "repair": True})
                by_tier = {(t["tier"], t["node"]): t for t in fixed["tiers"]}
                assert set(by_tier) == {
                    ("ssd", "node-a"),
                    ("ssd", "node-b"),
                    ("lustre", None),
                    ("s3", None),
                }
                s3_rep, lustre_rep = by_tier[("s3", None)], by_tier[("lustre", None)]
                assert s3_rep["counts"] == {"extra": 1, "abandoned_upload": 1}, s3_rep
                assert s3_rep["examples"]["extra"] == [f"{job}/{step}/stray.bin"]
                assert lustre_rep["counts"] == {"extra": 1, "abandoned_temp": 1}, lustre_rep
                assert s3_rep["cleaned"] == 1 and lustre_rep["cleaned"] == 1
                assert by_tier[("ssd", "node-a")]["counts"] == {}
                assert by_tier[("ssd", "node-a")]["checked"] == 1
                assert all(t["marked"] == 0 and t["error"] is None for t in fixed["tiers"])
                assert fixed["repairs_requested"] == 0

                r = await api.post("/v1/reconcile", json={"tier": "tape"})
                assert r.status_code == 422 and r.json()["code"] == "unknown_tier", r.text
                r = await api.post("/v1/reconcile", json={"job": "no-such-job"})
                assert r.status_code == 404 and r.json()["code"] == "job_not_found", r.text
                r = await api.get(f"/v1/reconcile/{'0' * 32}")
                assert r.status_code == 404 and r.json()["code"] == "reconcile_not_found"

        assert not temp.exists()
        assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads")
        assert stray.read_bytes() == b"z"
        for key in (f"{prefix}{job}/{step}/stray.bin", f"{prefix}nobody/1/a.bin"):
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert marker_states(engine, cp) == dict.fromkeys(("ssd", "lustre", "s3"), "restorable")
        assert_catalog_matches_tiers(cfg, engine, [cp])
    finally:
        engine.dispose()
