"""torch.distributed.checkpoint through tierpoint on the real stack: ranks of real processes (gloo,
each its own simulated node) save with TierpointWriter and load with TierpointReader.

The ranks run in `.venv-torch` (torch and the client, none of the server's packages; built by
`python3 bootstrap.py test`); each checks the values it loaded against the state it knows was
saved and reports back in JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from tierpoint_client import Checkpoint, NotFoundError

from tests.helpers.client import Stack

ROOT = Path(__file__).resolve().parents[3]
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
RANK_SCRIPT = Path(__file__).with_name("dcp_rank.py")
WAIT = 300.0  # hang guards only
TIERS = ("ssd", "lustre", "s3")
FILES = {"__0_0.distcp", "__1_0.distcp", ".metadata"}


@pytest.fixture(scope="module", autouse=True)
def _torch_venv() -> None:
    if not TORCH_PYTHON.exists():
        pytest.fail(
            f"{TORCH_PYTHON.parent.parent.name}/ is missing: run `python3 bootstrap.py test`"
        )


def _job() -> str:
    return f"dcp-{uuid.uuid4().hex[:10]}"


async def _ranks(
    stack: Stack,
    tmp: Path,
    action: str,
    job: str,
    *,
    world: int,
    step: int | None = None,
    tier: str | None = None,
    expect_ok: bool = True,
) -> list[dict[str, Any]]:
    """Run `world` ranks (rank i on node i) to completion; their JSON reports, rank order."""
    run = tmp / f"{action}-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env |= {
            "TIERPOINT_API_URL": stack.api_url,
            "TIERPOINT_TOKEN": stack.token,
            "TIERPOINT_NODE": stack.nodes[rank],
            "OMP_NUM_THREADS": "1",
        }
        cmd = [str(TORCH_PYTHON), str(RANK_SCRIPT), action, "--job", job]
        cmd += ["--rank", str(rank), "--world", str(world), "--init-file", str(run / "pg")]
        cmd += ["--out", str(run / f"rank{rank}.json")]
        if step is not None:
            cmd += ["--step", str(step)]
        if tier is not None:
            cmd += ["--tier", tier]
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        )
    outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), WAIT)
    codes = [p.returncode for p in procs]
    logs = "\n".join(
        f"--- rank {i}\n{o[0].decode(errors='replace')}" for i, o in enumerate(outputs)
    )
    if not expect_ok:
        assert all(c != 0 for c in codes), logs
        return []
    assert codes == [0] * world, logs
    return [json.loads((run / f"rank{i}.json").read_text()) for i in range(world)]


async def _wait_everywhere(stack: Stack, job: str, step: int) -> Checkpoint:
    cp = None
    for tier in TIERS:
        cp = await asyncio.to_thread(stack.client.wait_restorable, job, step, tier, WAIT, 0.2)
    detail = await asyncio.to_thread(stack.client.checkpoint, job, step)
    assert cp is not None and detail.shards is not None
    return detail


def _wipe_local(stack: Stack, job: str) -> None:
    for node in stack.nodes:
        shutil.rmtree(stack.local_dir(node, job, 0).parent)


def _corrupt_s3(stack: Stack, cp: Checkpoint, path: str) -> None:
    s3 = stack.settings.tier("s3")
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region)
    shard = next(s for s in cp.shards or () if s.path == path)
    location = next(r.location for r in shard.replicas if r.tier == "s3")
    assert location is not None
    bucket, key = location.removeprefix("s3://").split("/", 1)
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def _corrupt_file(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))


def _assert_loaded(reports: list[dict[str, Any]], step: int) -> None:
    for r in reports:
        assert r["step"] == step, r
        assert r["mismatches"] == [], r
        assert r["lease_released"], r


async def test_save_two_ranks_then_load_from_shared_and_s3_with_two_and_one(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = _job(), 10
    saved = await _ranks(stack, tmp_path, "save", job, world=2, step=step)
    assert [r["registered"] for r in saved] == [True, False]  # the coordinator registers once

    cp = await _wait_everywhere(stack, job, step)
    assert cp.metadata == {"saved_by": "dcp_rank"}
    assert {s.path for s in cp.shards or ()} == FILES
    node_a, node_b = stack.nodes
    assert {s.path: s.node for s in cp.shards or ()} == {
        "__0_0.distcp": node_a,
        "__1_0.distcp": node_b,
        ".metadata": node_a,
    }
    # Each rank wrote only on its own node, and nothing but the files (no temporary leftovers).
    assert {p.name for p in stack.local_dir(node_a, job, step).iterdir()} == {
        "__0_0.distcp",
        ".metadata",
    }
    assert {p.name for p in stack.local_dir(node_b, job, step).iterdir()} == {"__1_0.distcp"}

    _wipe_local(stack, job)
    for tier in ("lustre", "s3"):
        for world in (2, 1):
            loaded = await _ranks(stack, tmp_path, "load", job, world=world, tier=tier)
            _assert_loaded(loaded, step)
            assert [r["warnings"] for r in loaded] == [[]] * world
    # The leases were released: none is active any more.
    leases = await asyncio.to_thread(
        stack.client._http.request, "GET", f"/v1/jobs/{job}/checkpoints/{step}/leases"
    )
    assert leases.body["items"] == [], leases.body


async def test_async_save_saves_the_staged_state(stack: Stack, tmp_path: Path) -> None:
    job, step = _job(), 20
    saved = await _ranks(stack, tmp_path, "async_save", job, world=2, step=step)
    assert [r["registered"] for r in saved] == [True, False]
    await _wait_everywhere(stack, job, step)
    # From the local tiers (each rank's node has its own file), then with one rank (node a reads
    # node b's file from the shared tier).
    _assert_loaded(await _ranks(stack, tmp_path, "load", job, world=2), step)
    loaded = await _ranks(stack, tmp_path, "load", job, world=1)
    _assert_loaded(loaded, step)


async def test_a_corrupt_shared_copy_is_read_from_s3(stack: Stack, tmp_path: Path) -> None:
    job, step = _job(), 30
    await _ranks(stack, tmp_path, "save", job, world=2, step=step)
    await _wait_everywhere(stack, job, step)
    _wipe_local(stack, job)
    _corrupt_file(stack.shared_dir(job, step) / "__1_0.distcp")

    loaded = await _ranks(stack, tmp_path, "load", job, world=2)
    _assert_loaded(loaded, step)
    warned = [w for r in loaded for w in r["warnings"]]
    # The wiped local copies are missing, the shared one fails verification, S3's is read.
    assert any("__1_0.distcp on tier lustre failed verification" in w for w in warned), warned
    assert any("on tier ssd could not be read" in w for w in warned), warned


async def test_a_newest_checkpoint_corrupt_everywhere_loads_the_previous_step(
    stack: Stack, tmp_path: Path
) -> None:
    job = _job()
    await _ranks(stack, tmp_path, "save", job, world=2, step=40)
    await _ranks(stack, tmp_path, "save", job, world=2, step=50)
    await _wait_everywhere(stack, job, 40)
    newest = await _wait_everywhere(stack, job, 50)
    for node in stack.nodes:
        shutil.rmtree(stack.local_dir(node, job, 50))
    for path in FILES:
        _corrupt_file(stack.shared_dir(job, 50) / path)
        _corrupt_s3(stack, newest, path)

    loaded = await _ranks(stack, tmp_path, "load", job, world=1)
    _assert_loaded(loaded, 40)
    assert any(
        f"{job}/50: no verified copy of '.metadata'" in w
        and "loading the next older restorable step 40" in w
        for w in loaded[0]["warnings"]
    ), loaded[0]["warnings"]


async def test_a_save_failing_on_one_rank_registers_nothing(stack: Stack, tmp_path: Path) -> None:
    job, step = _job(), 60
    # Rank 1 cannot create its checkpoint directory: a file stands where it must go.
    blocked = stack.local_dir(stack.nodes[1], job, step)
    blocked.parent.mkdir(parents=True)
    blocked.write_bytes(b"in the way")
    await _ranks(stack, tmp_path, "save", job, world=2, step=step, expect_ok=False)
    with pytest.raises(NotFoundError):
        await asyncio.to_thread(stack.client.checkpoint, job, step)
