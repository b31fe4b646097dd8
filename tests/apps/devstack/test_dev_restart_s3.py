"""`tierpoint dev` restarted: its moto S3 lost every object while the catalog kept the S3 replicas.
At start the stack reconciles the S3 tier with repair before it reports ready, so latest
restorable never offers S3 for an object that is gone, and repair copies the objects back from the
tiers that still hold them: S3 is restorable again with the original bytes."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import crc32c
import pytest
from sqlalchemy import select

from tests.apps.devstack.test_dev_stack_e2e import (
    DevProcess,
    _stack_env,
    _tail,
    run_demo,
    start_dev,
)
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Checkpoint, Event, Job

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

REPAIR_TIMEOUT = 240.0


def _s3(dev: DevProcess) -> Any:
    s3 = dev.info.s3
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name=s3.region,
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
    )


def _keys_in_plan_exist(dev: DevProcess, plan: list[dict[str, Any]]) -> None:
    s3 = _s3(dev)
    for entry in plan:
        s3.head_object(Bucket=entry["bucket"], Key=entry["key"])  # raises if the object is gone


def test_restart_marks_gone_s3_objects_lost_and_copies_them_back() -> None:
    root = Path(tempfile.mkdtemp(prefix="tierpoint-e2e-s3-"))
    root.chmod(0o755)
    job = f"e2e-{uuid.uuid4().hex[:8]}"
    try:
        dev = start_dev(root / "dev", root / "dev-1.log")
        try:
            run_demo(dev, job, checkpoints=1)
        finally:
            assert dev.interrupt() == 0, _tail(dev.log)

        again = start_dev(dev.data_dir, root / "dev-2.log")
        try:
            with again.api() as api:
                # Ready means reconciled: S3 is offered only for objects that are there.
                r = api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
                if r.status_code == 200:
                    _keys_in_plan_exist(again, r.json()["plan"])
                else:
                    assert r.json()["code"] == "no_restorable_checkpoint", r.text
                r = api.get(f"/v1/jobs/{job}/checkpoints/latest")
                assert r.status_code == 200, r.text
                assert r.json()["step"] == 100

                deadline = time.monotonic() + REPAIR_TIMEOUT
                while True:
                    cp = api.get(f"/v1/jobs/{job}/checkpoints/100").json()
                    state = {t["tier"]: t["state"] for t in cp["tiers"]}["s3"]
                    if state == "restorable":
                        break
                    assert time.monotonic() < deadline, f"s3 is {state}:\n{_tail(again.log)}"
                    time.sleep(0.5)
                r = api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
                assert r.status_code == 200, r.text
                plan = r.json()["plan"]
                _keys_in_plan_exist(again, plan)
                s3 = _s3(again)
                for entry in plan:
                    body = s3.get_object(Bucket=entry["bucket"], Key=entry["key"])["Body"].read()
                    assert f"{crc32c.crc32c(body):08x}" == entry["crc32c"]
                replicas = [
                    rep for s in cp["shards"] for rep in s["replicas"] if rep["tier"] == "s3"
                ]
                assert replicas and all(rep["state"] == "verified" for rep in replicas)
            # What happened in between, from the catalog's history.
            engine = make_sync_engine(_stack_env(again)["TIERPOINT_DATABASE_URL"], pool_size=1)
            try:
                with engine.connect() as conn:
                    kinds = [
                        (k, a)
                        for k, a in conn.execute(
                            select(Event.kind, Event.actor)
                            .join(Checkpoint, Checkpoint.id == Event.checkpoint_id)
                            .join(Job, Job.id == Checkpoint.job_id)
                            .where(Job.name == job, Event.tier == "s3")
                            .order_by(Event.id)
                        )
                        if k in ("promoted", "lost", "repaired")
                    ]
            finally:
                engine.dispose()
            assert kinds[0] == ("promoted", "lifecycle")
            assert kinds[1] == ("lost", "reconcile")
            assert kinds[-1] == ("promoted", "lifecycle")
            assert {k for k, _ in kinds[2:-1]} == {"repaired"}
        finally:
            assert again.interrupt() == 0, _tail(again.log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
