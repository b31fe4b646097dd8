"""A copy a restore cannot read (its file gone from this node's disk and from the shared tier)
gives way to the shard's next verified copy, here S3's, as a user meets it on the real stack:
`tierpoint restore JOB DIR --node N` exits 0 with every shard verified. A copy that cannot be
read is not reported corrupt (a missing file says nothing of the bytes). With no copy of a shard
left, the restore fails naming every copy it tried and why, and DIR is as it was."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import boto3
from sqlalchemy import select
from tierpoint_client import build_manifest

from tests.helpers.cli import run_cli
from tests.helpers.client import Stack, read_tree, write_shards
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Event, Job

WAIT = 300.0  # hang guard only
MIB = 1024 * 1024
GONE = "model/rank1.bin"


async def _checkpoint(stack: Stack) -> tuple[str, int, dict[str, bytes]]:
    job, step, node = f"fallback-{uuid.uuid4().hex[:10]}", 2, stack.nodes[0]
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {"model/rank0.bin": MIB, GONE: 2 * MIB + 3, "meta.json": 40})
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    await stack.wait_restorable(job, step, "s3", WAIT)
    return job, step, shards


def _corrupt_events(stack: Stack, job: str) -> int:
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(Event.id)
                .join(Job, Job.id == Event.job_id)
                .where(Job.name == job, Event.kind == "corrupt")
            ).all()
        return len(rows)
    finally:
        engine.dispose()


async def test_a_missing_local_and_shared_file_is_read_from_s3(
    stack: Stack, tmp_path: Path
) -> None:
    job, step, shards = await _checkpoint(stack)
    node = stack.nodes[0]
    # Gone from this node's disk and from the shared tier; S3's copy is fine.
    (stack.local_dir(node, job, step) / GONE).unlink()
    (stack.shared_dir(job, step) / GONE).unlink()
    latest = await asyncio.to_thread(stack.client.latest, job, None, node)
    assert latest is not None
    assert {e.path: e.tier for e in latest.plan}[GONE] == "ssd"

    dest = tmp_path / "restored"
    out = await run_cli(stack.api_url, "restore", job, str(dest), "--node", node, token=stack.token)
    assert out.exit_code == 0, out.output
    assert "verified 3 shards" in out.output, out.output
    assert read_tree(dest) == shards
    row = next(line for line in out.output.splitlines() if GONE in line)
    assert [c.strip() for c in row.split("│") if c.strip()][-1] == "s3", out.output

    # The same from Python, and what each shard was read from.
    result = await asyncio.to_thread(
        lambda: stack.client.restore(job, tmp_path / "from-python", node=node)
    )
    assert read_tree(tmp_path / "from-python") == shards
    assert {f.path: f.tier for f in result.files} == {
        "model/rank0.bin": "ssd",
        GONE: "s3",
        "meta.json": "ssd",
    }
    # Unreadable is not corrupt: nothing was reported.
    assert _corrupt_events(stack, job) == 0


async def test_with_no_copy_left_the_restore_names_each_copy_and_why(
    stack: Stack, tmp_path: Path
) -> None:
    job, step, _ = await _checkpoint(stack)
    node = stack.nodes[0]
    (stack.local_dir(node, job, step) / GONE).unlink()
    (stack.shared_dir(job, step) / GONE).unlink()
    tier = stack.settings.tier("s3")
    s3 = boto3.client("s3", endpoint_url=tier.endpoint_url, region_name=tier.region)
    key = f"{tier.prefix}{job}/{step}/{GONE}"
    assert tier.bucket is not None
    s3.put_object(Bucket=tier.bucket, Key=key, Body=b"not the registered bytes")

    dest = tmp_path / "restored"
    out = await run_cli(stack.api_url, "restore", job, str(dest), "--node", node, token=stack.token)
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())
    assert f"no copy of '{GONE}' could be read and verified" in said, out.output
    assert "ssd copy could not be read" in said and "lustre copy could not be read" in said, said
    assert "does not exist" in said and "s3 copy" in said and "failed verification" in said, said
    assert f"{dest} was not created" in said, said
    assert not dest.exists()
