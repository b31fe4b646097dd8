"""One checkpoint, any reader: a step saved by URL (`dcp.save(checkpoint_id="tierpoint://...")`)
loads with TierpointReader, and one saved with TierpointWriter loads by URL; both on the real
stack, two ranks on two nodes, every tensor compared with torch.equal (dcp_rank's mismatches).
Steps saved by URL before both writers recorded their files alike (DCP's own records in
`.metadata`) still load with TierpointReader."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tierpoint_client.hashing import file_crc32c
from tierpoint_client.models import ShardSpec

from tests.client.torch.ranks import assert_loaded, new_job, ranks, wait_everywhere
from tests.client.torch.test_fsspec_dcp import ok, url_ranks
from tests.helpers.client import Stack


async def test_a_step_saved_by_url_loads_with_tierpoint_reader(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job("any"), 3
    ok(await url_ranks(stack, tmp_path, "save", f"tierpoint://{job}/step-{step}", step, world=2))
    await wait_everywhere(stack, job, step, ("ssd",))
    assert_loaded(await ranks(stack, tmp_path, "load", job, world=2, step=step), step)


async def test_a_step_saved_with_tierpoint_writer_loads_by_url(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job("any"), 5
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    await wait_everywhere(stack, job, step, ("ssd",))
    ok(await url_ranks(stack, tmp_path, "load", f"tierpoint://{job}/step-{step}", step, world=2))


async def test_a_step_saved_by_url_before_loads_with_tierpoint_reader(
    stack: Stack, tmp_path: Path
) -> None:
    """Such a step's `.metadata` holds DCP's records of its items (no size, checksum or node):
    the reader takes those from the catalog."""
    job, step = new_job("any"), 7
    # DCP's own FileSystemWriter, each rank writing to its node's local tier.
    folders = [stack.local_dir(node, job, step) for node in stack.nodes]
    template = str(stack.local_dir("{node}", job, step))
    ok(await url_ranks(stack, tmp_path, "folder_save", template, step, world=2))
    shards = []
    for node, folder in zip(stack.nodes, folders, strict=True):
        for path in sorted(folder.iterdir()):
            size, crc = file_crc32c(path)
            shards.append(ShardSpec(path.name, size, crc, node))
    assert {s.path for s in shards} == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    await asyncio.to_thread(stack.client.register_manifest, job, step, shards)
    await wait_everywhere(stack, job, step, ("ssd",))
    assert_loaded(await ranks(stack, tmp_path, "load", job, world=2, step=step), step)
