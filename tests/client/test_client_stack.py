"""The client against the real API, catalog, Temporal workers, shared directory and S3.

Client calls block (urllib), and the workers run in this event loop, so every call goes through
asyncio.to_thread.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from tierpoint_client import (
    ApiError,
    CheckpointFailedError,
    ChecksumMismatchError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    NoVerifiedCopyError,
    ShardSpec,
    build_manifest,
)

from tests.helpers.client import Stack, read_tree, write_shards

WAIT = 300.0  # generous: the machine is shared; nothing asserts on timing


def _job() -> str:
    return f"client-{uuid.uuid4().hex[:10]}"


async def _two_node_checkpoint(stack: Stack, job: str, step: int) -> dict[str, bytes]:
    """Each node writes its own shards locally; rank 0 registers the gathered manifest."""
    node_a, node_b = stack.nodes
    shards = write_shards(
        stack.local_dir(node_a, job, step),
        {"model/rank0.bin": 3_000_000, "optim/rank0.bin": 70_000, "meta.json": 12},
    )
    shards |= write_shards(
        stack.local_dir(node_b, job, step),
        {"model/rank1.bin": 2_500_001, "optim/rank1.bin": 1},
    )
    manifest = [
        *build_manifest(stack.local_dir(node_a, job, step), node_a),
        *build_manifest(stack.local_dir(node_b, job, step), node_b),
    ]
    await asyncio.to_thread(
        stack.client.register_manifest, job, step, manifest, {"loss": 1.25, "tags": ["t"]}
    )
    return shards


async def test_register_promote_and_restore_from_every_tier(stack: Stack, tmp_path: Path) -> None:
    client, (node_a, node_b) = stack.client, stack.nodes
    job, step = _job(), 100
    shards = await _two_node_checkpoint(stack, job, step)

    cp = await asyncio.to_thread(client.wait_restorable, job, step, "s3", WAIT, 0.2)
    assert (cp.shard_count, cp.total_bytes) == (len(shards), sum(map(len, shards.values())))
    assert cp.metadata == {"loss": 1.25, "tags": ["t"]}
    assert cp.shards is not None and {s.path for s in cp.shards} == set(shards)

    for tier in ("s3", "lustre"):
        dest = tmp_path / tier
        result = await asyncio.to_thread(client.restore, job, dest, tier=tier, workers=3)
        assert (result.job, result.step) == (job, step)
        assert read_tree(dest) == shards
        assert result.tiers_used == {tier: len(shards)}
        assert {f.path: f.size for f in result.files} == {k: len(v) for k, v in shards.items()}

    # On node a, its own local copies are the fastest source; node b's shards come from elsewhere.
    seen: list[tuple[int, int]] = []
    dest = tmp_path / "node-a"
    result = await asyncio.to_thread(
        lambda: client.restore(
            job, dest, node=node_a, progress=lambda done, total: seen.append((done, total))
        )
    )
    assert read_tree(dest) == shards
    sources = {f.path: f.tier for f in result.files}
    assert {p for p, t in sources.items() if t == "ssd"} == {
        "model/rank0.bin",
        "optim/rank0.bin",
        "meta.json",
    }
    assert seen[-1] == (result.bytes_total, result.bytes_total)

    # Without a node, local copies do not count.
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and latest.step == step
    assert all(p.kind != "local" for p in latest.plan)
    # And node b's plan does not offer node a's local copies.
    latest_b = await asyncio.to_thread(client.latest, job, None, node_b)
    assert latest_b is not None
    assert all(p.node in (None, node_b) for p in latest_b.plan if p.kind == "local")


async def test_register_directory_twice_returns_the_same_checkpoint(stack: Stack) -> None:
    client, node = stack.client, stack.nodes[0]
    job, step = _job(), 7
    directory = stack.local_dir(node, job, step)
    write_shards(directory, {"a.bin": 1000, "sub/b.bin": 200_000})

    first = await asyncio.to_thread(client.register, job, step, directory, node, {"loss": 2.0})
    again = await asyncio.to_thread(client.register, job, step, directory, node, {"loss": 2.0})
    assert (again["job"], again["step"], again["created_at"]) == (
        first["job"],
        first["step"],
        first["created_at"],
    )
    assert first["shard_count"] == 2

    # A different manifest for the same step is a conflict and changes nothing.
    (directory / "a.bin").write_bytes(b"other bytes")
    with pytest.raises(ConflictError) as info:
        await asyncio.to_thread(client.register, job, step, directory, node)
    assert info.value.code == "checkpoint_conflict"
    cp = await asyncio.to_thread(client.checkpoint, job, step)
    assert cp.shards is not None
    assert {s.path: s.size for s in cp.shards} == {"a.bin": 1000, "sub/b.bin": 200_000}


async def test_corrupted_source_raises_and_leaves_no_final_file(
    stack: Stack, tmp_path: Path
) -> None:
    client = stack.client
    job, step = _job(), 3
    shards = await _two_node_checkpoint(stack, job, step)
    # The shared tier's copy and S3's run side by side: wait for both.
    await asyncio.to_thread(client.wait_restorable, job, step, "lustre", WAIT, 0.2)
    await asyncio.to_thread(client.wait_restorable, job, step, "s3", WAIT, 0.2)

    victim = "model/rank1.bin"
    on_lustre = stack.shared_dir(job, step) / victim
    data = bytearray(on_lustre.read_bytes())
    data[len(data) // 2] ^= 0xFF
    on_lustre.write_bytes(bytes(data))

    dest = tmp_path / "restore"
    with pytest.raises(NoVerifiedCopyError) as info:
        await asyncio.to_thread(client.restore, job, dest, tier="lustre", workers=1)
    assert info.value.path == victim
    assert isinstance(info.value.__cause__, ChecksumMismatchError)
    # All or nothing: neither the good shards nor a temporary file is left.
    assert not dest.exists()

    # The S3 copy is intact and restores.
    result = await asyncio.to_thread(client.restore, job, tmp_path / "from-s3", tier="s3")
    assert read_tree(tmp_path / "from-s3") == shards
    assert result.tiers_used == {"s3": len(shards)}


async def test_errors_carry_problem_codes(stack: Stack, tmp_path: Path) -> None:
    client, node = stack.client, stack.nodes[0]
    job = _job()
    good: dict[str, Any] = {"path": "a.bin", "size": 1, "crc32c": "00000000", "node": node}

    async def refused(job: str, step: int, shards: list[dict[str, Any]]) -> InvalidRequestError:
        with pytest.raises(InvalidRequestError) as info:
            await asyncio.to_thread(client.register_manifest, job, step, shards)
        return info.value

    assert (await refused("bad name!", 1, [good])).code == "invalid_job_name"
    assert (await refused(job, 1, [{**good, "path": "../x"}])).code == "unsafe_path"
    assert (await refused(job, 1, [{**good, "path": "/etc/passwd"}])).code == "unsafe_path"
    assert (await refused(job, 1, [{**good, "node": "no-such-node"}])).code == "unknown_node"
    err = await refused(job, 1, [{**good, "crc32c": "xyz"}])
    assert err.code in ("invalid_manifest", "validation_error")
    assert err.detail

    with pytest.raises(NotFoundError) as nf:
        await asyncio.to_thread(client.checkpoint, job, 1)
    assert nf.value.code == "job_not_found"

    # Nothing was registered by the refused requests.
    assert await asyncio.to_thread(client.latest, job) is None
    with pytest.raises(NotFoundError) as nj:
        await asyncio.to_thread(lambda: list(client.checkpoints(job)))
    assert nj.value.code == "job_not_found"
    with pytest.raises(NotFoundError) as nr:
        await asyncio.to_thread(client.restore, job, tmp_path / "dest")
    assert nr.value.code == "no_restorable_checkpoint"
    assert not (tmp_path / "dest").exists()

    # 404 or 422 are both fair for an unknown tier; the code is what callers match on.
    with pytest.raises(ApiError) as ut:
        await asyncio.to_thread(client.latest, job, "no-such-tier")
    assert ut.value.status in (404, 422)
    assert ut.value.code == "unknown_tier"


async def test_wait_restorable_raises_when_the_registered_checksum_is_wrong(stack: Stack) -> None:
    client, node = stack.client, stack.nodes[0]
    job, step = _job(), 11
    directory = stack.local_dir(node, job, step)
    write_shards(directory, {"good.bin": 5000, "bad.bin": 5000})
    manifest = build_manifest(directory, node)
    lying = [
        ShardSpec(s.path, s.size, "00000000" if s.crc32c != "00000000" else "00000001", s.node)
        if s.path == "bad.bin"
        else s
        for s in manifest
    ]
    await asyncio.to_thread(client.register_manifest, job, step, lying)
    with pytest.raises(CheckpointFailedError) as info:
        await asyncio.to_thread(client.wait_restorable, job, step, "ssd", WAIT, 0.2)
    assert (info.value.tier, info.value.state) == ("ssd", "failed")
    assert info.value.reason
    assert await asyncio.to_thread(client.latest, job, None, node) is None
