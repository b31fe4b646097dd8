"""A copy quarantined on its tier (an operator's verdict that it must not be restored from) is
never read by a restore, not even as the copy it falls back on when the planned one cannot be
read: the restore goes on to the next copy that is not quarantined.

It did read it (found by the stateful test): the fallback took every tier whose marker was
`restorable`, quarantined or not, and so did the torch reader's choice of sources, which asks the
same question of the checkpoint (`Checkpoint.restorable_tiers`).

Real stack (the API under uvicorn, workers, Postgres, Temporal, moto S3); the restore is the
client's, called as a restarting job calls it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from tierpoint_client import build_manifest

from tests.helpers.client import Stack, read_tree, write_shards

WAIT = 300.0  # hang guard only
GONE = "model/rank1.bin"


async def test_a_fallback_skips_a_copy_quarantined_on_its_tier(
    stack: Stack, tmp_path: Path
) -> None:
    job, step, node = f"quarantined-{uuid.uuid4().hex[:10]}", 3, stack.nodes[0]
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {"model/rank0.bin": 4096, GONE: 70_000, "meta.json": 40})
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    # The shared tier's copy and S3's run side by side: wait for both.
    await stack.wait_restorable(job, step, "lustre", WAIT)
    await stack.wait_restorable(job, step, "s3", WAIT)
    # The shared tier's copy is held to be bad; the node's own copy of one shard is gone.
    await asyncio.to_thread(stack.client.quarantine, job, step, "bad load from lustre", "lustre")
    (local / GONE).unlink()

    result = await asyncio.to_thread(
        lambda: stack.client.restore(job, tmp_path / "restored", node=node)
    )

    assert read_tree(tmp_path / "restored") == shards
    assert {f.path: f.tier for f in result.files} == {
        "model/rank0.bin": "ssd",
        GONE: "s3",
        "meta.json": "ssd",
    }
