"""The client's quarantine after a bad load, against the real stack: the next `latest()` and
`restore()` walk back to the previous checkpoint and say why; lifting brings the step back."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tierpoint_client import InvalidRequestError, NotFoundError

from tests.helpers.client import Stack, read_tree, write_shards

WAIT = 300.0


async def _checkpoint(stack: Stack, job: str, step: int) -> dict[str, bytes]:
    node = stack.nodes[0]
    directory = stack.local_dir(node, job, step)
    shards = write_shards(directory, {"model.bin": 4096 + step, "optim.bin": 100})
    await asyncio.to_thread(stack.client.register, job, step, directory, node)
    # The shared tier's copy and S3's run side by side: wait for both.
    await stack.wait_restorable(job, step, "lustre", WAIT)
    await stack.wait_restorable(job, step, "s3", WAIT)
    return shards


async def test_quarantine_walks_back_and_lift_restores_the_step(
    stack: Stack, tmp_path: Path
) -> None:
    client, job = stack.client, f"client-q-{uuid.uuid4().hex[:8]}"
    older = await _checkpoint(stack, job, 10)
    await _checkpoint(stack, job, 20)

    cp = await asyncio.to_thread(client.quarantine, job, 20, "loss is NaN after load")
    assert (cp.step, cp.quarantine_reason) == (20, "loss is NaN after load")
    result = await asyncio.to_thread(client.restore, job, tmp_path / "walked-back")
    assert result.step == 10 and read_tree(tmp_path / "walked-back") == older
    assert [(s.step, s.reasons) for s in result.skipped] == [
        (20, ("quarantined: loss is NaN after load",))
    ]

    lifted = await asyncio.to_thread(client.lift_quarantine, job, 20)
    assert lifted.quarantine_reason is None
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and latest.step == 20

    # One tier's copy: restores restricted to it walk back, others still get step 20.
    cp = await asyncio.to_thread(client.quarantine, job, 20, "bad crc", "lustre")
    lustre = cp.tier("lustre")
    assert lustre is not None and lustre.quarantine_reason == "bad crc"
    on_lustre = await asyncio.to_thread(client.latest, job, "lustre")
    assert on_lustre is not None and on_lustre.step == 10
    on_s3 = await asyncio.to_thread(client.latest, job, "s3")
    assert on_s3 is not None and on_s3.step == 20
    cp = await asyncio.to_thread(client.lift_quarantine, job, 20, "lustre")
    lustre = cp.tier("lustre")
    assert lustre is not None and lustre.quarantine_reason is None


async def test_quarantine_refusals(stack: Stack) -> None:
    client, job = stack.client, f"client-q-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFoundError) as missing:
        await asyncio.to_thread(client.quarantine, job, 1, "x")
    assert missing.value.code == "job_not_found"
    with pytest.raises(InvalidRequestError) as empty:
        await asyncio.to_thread(client.quarantine, job, 1, "")
    assert empty.value.code == "validation_error"
