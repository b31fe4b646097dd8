"""A delete of an S3 copy cannot remove the object of the step's next checkpoint.

An S3 object has no identity of ours that a newer one lacks: a step written again with the same
bytes has the same ETag. What keeps the next checkpoint's object safe is the order of things: the
step can be registered again only once every copy of the deleted one is `expired`, and a copy
becomes `expired` only when no delete of it is still running, since every delete holds the copy's
delete lock (shared) from its check of the marker until its last request, and the finish takes it
exclusively (`tierpoint/catalog/tier_copy/expiry.py: hold_for_delete`). A delete attempt that
outlived its timeout (Temporal retried it, the retry finished, the worker thread is still in the old
one) is the case that needs it; an attempt that starts after the finish finds the marker `expired`
and deletes nothing.

Here such an attempt is held on its way to S3 by a proxy in front of moto (a real
`retention.delete_copy`, run as the test in tests/workflows/test_retention.py runs one by hand),
while the real workers delete and finish the copy and the job retries its registration. It is
let go only once the finish of the S3 copy waits for it (as built), or once the step's new
checkpoint is restorable on S3 (without the lock: then its late DeleteObjects lands on the new
object). Either way the new checkpoint's object must be there afterwards, with its bytes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import boto3
import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from activities.retention import RetentionActivities
from activities.stores import Stores
from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.hold_proxy import hold_proxy
from tests.helpers.lifecycle import running_workers
from tests.helpers.services import with_tier
from tests.helpers.tokens import bearer, create_token
from tests.workflows.test_delete_then_rewrite import (
    STEP,
    WAIT,
    cp_id,
    manifest,
    register_until_accepted,
    restorable_on,
    write_step,
)
from tierpoint.config import Settings
from tierpoint.contract.retention import DeleteInput


def finish_waits(engine: Engine) -> bool:
    """A transaction waits for a delete lock: the finish of a copy whose delete still runs."""
    with engine.connect() as conn:
        n = conn.scalar(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        )
    return bool(n)


def s3_state(job_client: TierpointClient, job: str) -> str | None:
    tier = job_client.checkpoint(job, STEP).tier("s3")
    return None if tier is None else tier.state


async def test_a_delete_attempt_still_on_its_way_to_s3_lands_before_the_step_comes_back(
    settings: Settings,
    client: Client,
    engine: Engine,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    job = f"late-{uuid.uuid4().hex[:10]}"
    admin = create_token(settings.database_url, scopes=["admin"])
    train = create_token(settings.database_url, scopes=[f"train:{job}"])
    old = {("node-a", "a.bin"): os.urandom(64 * 1024)}
    new = {key: os.urandom(64 * 1024) for key in old}
    s3 = settings.tier("s3")
    assert s3.endpoint_url is not None
    async with serving(create_app(settings)) as api:
        job_client = TierpointClient(api, token=train)
        since = db_now(engine)
        async with running_workers(settings, client):
            await workers_reported_in(engine, ("node-a", "node-b"), since)
            write_step(settings, job, old)
            await asyncio.to_thread(job_client.register_manifest, job, STEP, manifest(old))
            await restorable_on(job_client, job, settings.tier_names())
        old_id = cp_id(engine, job)
        # The workers are down: the deletion's expiries wait for them.
        async with httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http:
            r = await http.delete(f"/v1/jobs/{job}/checkpoints/{STEP}")
        assert r.status_code == 202, r.text
        write_step(settings, job, new)

        with hold_proxy(s3.endpoint_url, "?delete") as proxy:
            via_proxy = with_tier(settings, "s3", endpoint_url=proxy.url)
            late = RetentionActivities(sessions, via_proxy, Stores(via_proxy))
            attempt = DeleteInput(job=job, checkpoint_id=old_id, step=STEP, tier="s3", node=None)
            stalled = asyncio.create_task(asyncio.to_thread(late.delete_copy, attempt))
            async with asyncio.timeout(WAIT):
                while proxy.held() == 0:
                    assert not stalled.done(), stalled
                    await asyncio.sleep(0.05)

            async with running_workers(settings, client):
                registering = asyncio.create_task(
                    register_until_accepted(job_client, job, manifest(new))
                )
                async with asyncio.timeout(WAIT):
                    while not (  # noqa: ASYNC110 (polling the catalog and the API)
                        await asyncio.to_thread(finish_waits, engine)
                        or await asyncio.to_thread(s3_state, job_client, job) == "restorable"
                    ):
                        await asyncio.sleep(0.1)
                proxy.release()
                await stalled
                await registering
                await restorable_on(job_client, job, settings.tier_names())
                cp = await asyncio.to_thread(job_client.checkpoint, job, STEP)

    assert cp_id(engine, job) != old_id
    (shard,) = cp.shards or ()
    (replica,) = [r for r in shard.replicas if r.tier == "s3"]
    assert replica.bucket is not None and replica.key is not None
    raw = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region)
    body = raw.get_object(Bucket=replica.bucket, Key=replica.key)["Body"].read()
    assert body == new[("node-a", "a.bin")]
