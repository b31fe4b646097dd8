"""A reader finds a copy whose bytes do not match: the client's restore reports it
(`Client.report_corrupt_copy`), the server reads that replica back itself, confirms, marks it
corrupt, demotes the tier and starts a repair, and the restore goes on from another verified copy
of the same shard. A report the server cannot confirm changes nothing; reporting again changes
nothing; unknown job, step, tier or path are 404 problems."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.client import WorkflowExecutionStatus
from tierpoint_client import NotFoundError, build_manifest

from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.lifecycle import record_history, recording_histories
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Event
from tierpoint.temporal import connect

WAIT = 300.0


def _corrupt_events(stack: Stack, tier: str) -> int:
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(Event.id).where(Event.kind == "corrupt", Event.tier == tier)
            ).all()
        return len(rows)
    finally:
        engine.dispose()


async def test_restore_reports_a_corrupt_copy_and_reads_another(
    stack: Stack, tmp_path: Path
) -> None:
    client, node = stack.client, stack.nodes[0]
    job, step = f"report-{uuid.uuid4().hex[:10]}", 5
    shards = write_shards(stack.local_dir(node, job, step), {"a.bin": 300_000, "b.bin": 70_000})
    manifest = build_manifest(stack.local_dir(node, job, step), node)
    await asyncio.to_thread(client.register_manifest, job, step, manifest)
    # The shared tier's copy and S3's run side by side: wait for both.
    await asyncio.to_thread(client.wait_restorable, job, step, "lustre", WAIT)
    await asyncio.to_thread(client.wait_restorable, job, step, "s3", WAIT)

    # A good copy reported bad: re-read, not confirmed, nothing changes; at once again: not
    # even re-read.
    out = await asyncio.to_thread(
        client.report_corrupt_copy, job, step, "lustre", "b.bin", "my read failed"
    )
    assert out == {
        "replica_state": "verified",
        "marker_state": "restorable",
        "repair": "not needed",
        "verification": "not confirmed",
    }
    again = await asyncio.to_thread(
        client.report_corrupt_copy, job, step, "lustre", "b.bin", "my read failed"
    )
    assert again["verification"] == "recently read back good"
    assert again["replica_state"] == "verified"

    before = _corrupt_events(stack, "lustre")
    bad = stack.shared_dir(job, step) / "a.bin"
    data = bytearray(bad.read_bytes())
    data[123] ^= 0x40
    bad.write_bytes(bytes(data))

    result = await asyncio.to_thread(client.restore, job, tmp_path / "out")
    assert read_tree(tmp_path / "out") == shards
    tiers = {f.path: f.tier for f in result.files}
    assert tiers == {"a.bin": "s3", "b.bin": "lustre"}, tiers
    assert _corrupt_events(stack, "lustre") == before + 1
    if recording_histories():
        temporal = await connect(stack.settings)
        async for wf in temporal.list_workflows("WorkflowType = 'VerifyReplicas'"):
            if wf.status == WorkflowExecutionStatus.COMPLETED:
                await record_history(temporal, wf.id, "verify_replicas")
                break

    # The report confirmed it; a second report of the same copy changes nothing new (it is
    # corrupt, being copied back, or already repaired and read good).
    second = await asyncio.to_thread(
        client.report_corrupt_copy, job, step, "lustre", "a.bin", "again"
    )
    assert second["verification"] in ("already corrupt", "already copying", "not confirmed")
    if second["replica_state"] == "corrupt":
        assert second["repair"] == "started", second
    assert _corrupt_events(stack, "lustre") == before + 1

    # The repair the report started copies it back and lustre is restorable again.
    # (`wait_restorable` would give up on the `failed` marker the repair promotes.)
    deadline = time.monotonic() + WAIT
    while (await asyncio.to_thread(client.checkpoint, job, step)).tier("lustre").state != (  # type: ignore[union-attr]
        "restorable"
    ):
        assert time.monotonic() < deadline, "lustre never restorable again"
        await asyncio.sleep(0.3)
    assert bad.read_bytes() == shards["a.bin"]

    for args, code in [
        ((job, step, "tape", "a.bin"), "copy_not_found"),
        ((job, step, "lustre", "nope.bin"), "copy_not_found"),
        ((job, step + 1, "lustre", "a.bin"), "checkpoint_not_found"),
        (("no-such-job", step, "lustre", "a.bin"), "job_not_found"),
    ]:
        with pytest.raises(NotFoundError) as info:
            await asyncio.to_thread(client.report_corrupt_copy, *args, "x")
        assert info.value.code == code
