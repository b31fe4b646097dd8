"""Retention racing a restore, on the real stack: a job keeps one checkpoint on the shared tier; a
restore of step 1 from that tier is under way (held still mid-shard by its progress callback) when
step 2 becomes restorable and retention runs. The restore's lease, taken with the answer that
chose step 1 and renewed past its first end while the restore stands still, keeps step 1's
shared copy; the restore completes from it; its release asks retention again, which expires it.
Without the lease retention deleted the files being read and the restore failed."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from tierpoint_client import build_manifest

from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.retention import create_job, markers, settle, utcnow
from tests.helpers.tokens import bearer
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.temporal import connect

WAIT = 300.0  # hang guard only
MIB = 1024 * 1024
# Short, so that the test sees the lease outlive its first end; renewed every TTL / 3.
TTL = 6
LUSTRE_LAST_1 = {"tiers": {"lustre": {"keep_last": 1}}}


async def _register(stack: Stack, job: str, step: int) -> dict[str, bytes]:
    node = stack.nodes[0]
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {"a.bin": 2 * MIB, "b.bin": MIB + 1})
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    await stack.wait_restorable(job, step, "s3", WAIT)
    return shards


async def _leases(stack: Stack, job: str, step: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stack.api_url, headers=bearer(stack.token)) as http:
        r = await http.get(f"/v1/jobs/{job}/checkpoints/{step}/leases", params={"all": "true"})
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def test_retention_keeps_what_a_running_restore_reads_until_it_ends(
    stack: Stack, tmp_path: Path
) -> None:
    job = f"lease-{uuid.uuid4().hex[:10]}"
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    sessions = sync_sessions(engine)
    temporal = await connect(stack.settings)
    create_job(sessions, job, LUSTRE_LAST_1)
    shards = await _register(stack, job, 1)
    await settle(temporal, job)

    reading, go = threading.Event(), threading.Event()

    def paused(done: int, total: int) -> None:
        """The restore's first bytes are in: it stands still here until the test lets it go."""
        if not reading.is_set():
            reading.set()
            go.wait(WAIT)

    dest = tmp_path / "restored"
    restore = asyncio.ensure_future(
        asyncio.to_thread(
            lambda: stack.client.restore(
                job, dest, tier="lustre", workers=1, progress=paused, lease_ttl=TTL
            )
        )
    )
    try:
        assert await asyncio.to_thread(reading.wait, WAIT)
        (lease,) = await _leases(stack, job, 1)
        assert lease["active"] and lease["released_at"] is None, lease
        first_end = datetime.fromisoformat(lease["expires_at"])
        # The lease outlives its first end: renewed while the restore stands still.
        while utcnow(sessions) <= first_end:
            assert not restore.done(), restore
            await asyncio.sleep(0.2)
        (renewed,) = await _leases(stack, job, 1)
        assert renewed["active"] and datetime.fromisoformat(renewed["expires_at"]) > first_end

        # Step 2 becomes restorable: the policy now wants step 1 off the shared tier.
        await _register(stack, job, 2)
        await settle(temporal, job)
        assert markers(sessions, job)[(1, "lustre")] == "restorable"
        assert all((stack.shared_dir(job, 1) / p).exists() for p in shards)
    finally:
        go.set()
        result = await asyncio.wait_for(restore, WAIT)
    assert (result.step, result.tiers_used) == (1, {"lustre": 2})
    assert read_tree(dest) == shards

    # The restore released its lease, which asked retention again: step 1 leaves the shared tier.
    (ended,) = await _leases(stack, job, 1)
    assert ended["released_at"] is not None, ended
    await settle(temporal, job)
    assert markers(sessions, job)[(1, "lustre")] == "expired"
    engine.dispose()
