"""`--tier` means that tier only, and progress counts a re-read once: on the real stack, with a
copy whose bytes were changed behind the catalog's back."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import boto3
import pytest
from tierpoint_client import NoVerifiedCopyError, build_manifest

from tests.helpers.cli import run_cli
from tests.helpers.client import Stack, read_tree, write_shards

WAIT = 300.0  # hang guard only
MIB = 1024 * 1024


async def _checkpoint(stack: Stack) -> tuple[str, int, dict[str, bytes]]:
    """A checkpoint restorable on the shared tier and S3."""
    job, step, node = f"tier-only-{uuid.uuid4().hex[:10]}", 3, stack.nodes[0]
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {"a.bin": 3 * MIB, "b.bin": MIB})
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    for tier in ("lustre", "s3"):
        await stack.wait_restorable(job, step, tier, WAIT)
    return job, step, shards


def _flip_s3(stack: Stack, job: str, step: int, path: str) -> None:
    tier = stack.settings.tier("s3")
    assert tier.bucket is not None
    s3 = boto3.client("s3", endpoint_url=tier.endpoint_url, region_name=tier.region)
    key = f"{tier.prefix}{job}/{step}/{path}"
    data = bytearray(s3.get_object(Bucket=tier.bucket, Key=key)["Body"].read())
    data[0] ^= 0xFF
    s3.put_object(Bucket=tier.bucket, Key=key, Body=bytes(data))


async def test_restore_from_one_tier_does_not_go_on_from_another(
    stack: Stack, tmp_path: Path
) -> None:
    """A bad S3 copy fails a restore asked of S3 only, from the CLI and from a plan `latest`
    gave for S3, instead of quietly reading the shared tier. (Each run reports the bad copy,
    which the server then repairs: each gets a checkpoint of its own.)"""
    (job, step, _), (job2, step2, _) = await asyncio.gather(_checkpoint(stack), _checkpoint(stack))
    _flip_s3(stack, job, step, "a.bin")
    _flip_s3(stack, job2, step2, "a.bin")

    dest = tmp_path / "cli"
    out = await run_cli(stack.api_url, "restore", job, str(dest), "--tier", "s3", token=stack.token)
    assert out.exit_code != 0, out.output
    assert "s3 copy" in out.output and "failed verification" in out.output, out.output
    assert "lustre" not in out.output, out.output
    assert not dest.exists()

    latest = await asyncio.to_thread(stack.client.latest, job2, "s3")
    assert latest is not None
    with pytest.raises(NoVerifiedCopyError) as info:
        await asyncio.to_thread(stack.client.restore_checkpoint, latest, tmp_path / "plan")
    assert [t.split()[0] for t in info.value.tried] == ["s3"]
    assert not (tmp_path / "plan").exists()


async def test_progress_of_a_restore_that_reads_a_shard_twice_ends_at_the_total(
    stack: Stack, tmp_path: Path
) -> None:
    """The shared copy of a.bin is bad: the restore reads it, then S3's good one. The bytes of
    the bad read are not counted as restored (it used to end at 7.0 of 4.0 MiB)."""
    job, step, shards = await _checkpoint(stack)
    bad = stack.shared_dir(job, step) / "a.bin"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))

    seen: list[tuple[int, int]] = []
    result = await asyncio.to_thread(
        lambda: stack.client.restore(
            job, tmp_path / "dest", workers=1, progress=lambda d, t: seen.append((d, t))
        )
    )
    assert read_tree(tmp_path / "dest") == shards
    assert {f.path: f.tier for f in result.files} == {"a.bin": "s3", "b.bin": "lustre"}
    total = 4 * MIB
    assert seen[-1] == (total, total)
    assert max(d for d, _ in seen) <= total
