"""Running DCP ranks (dcp_rank.py) in `.venv-torch` against the client test stack, and the copies
of a checkpoint they read: waiting for them, wiping and corrupting them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from tierpoint_client import Checkpoint

from tests.helpers.client import Stack

ROOT = Path(__file__).resolve().parents[3]
TORCH_VENV = ROOT / ".venv-torch"
TORCH_PYTHON = TORCH_VENV / "bin" / "python"
RANK_SCRIPT = Path(__file__).with_name("dcp_rank.py")
WAIT = 300.0  # hang guards only
TIERS = ("ssd", "lustre", "s3")


def require_torch_venv() -> None:
    if not TORCH_PYTHON.exists():
        pytest.fail(f"{TORCH_VENV.name}/ is missing: run `python3 bootstrap.py test`")


def new_job(prefix: str = "dcp") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def rank_env(stack: Stack, api_url: str | None = None) -> dict[str, str]:
    """The environment of a training process on this stack (its node id set by the caller),
    talking to its API at `api_url` (a proxy of it) or its own."""
    env = dict(os.environ)
    env.pop("TIERPOINT_NODE", None)
    env |= {
        "TIERPOINT_API_URL": api_url or stack.api_url,
        "TIERPOINT_TOKEN": stack.token,
        "OMP_NUM_THREADS": "1",
    }
    return env


@dataclass(frozen=True)
class Ranks:
    reports: list[dict[str, Any]]  # rank order; empty when the ranks were expected to fail
    logs: str


async def run_ranks(
    stack: Stack,
    tmp: Path,
    action: str,
    job: str,
    *,
    world: int,
    step: int | None = None,
    tier: str | None = None,
    extra: tuple[str, ...] = (),
    nodes: tuple[str, ...] | None = None,
    expect_ok: bool = True,
    api_url: str | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Ranks:
    """Run `world` ranks (rank i on node i, or on `nodes[i]`) to completion, talking to the
    stack's API (or to `api_url`); `env` changes their environment (None: a variable unset)."""
    run = tmp / f"{action}-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    procs = []
    for rank in range(world):
        node = (nodes or stack.nodes)[rank]
        rank_vars: dict[str, str | None] = {**rank_env(stack, api_url), "TIERPOINT_NODE": node}
        rank_vars |= env or {}
        cmd = [str(TORCH_PYTHON), str(RANK_SCRIPT), action, "--job", job]
        cmd += ["--rank", str(rank), "--world", str(world), "--init-file", str(run / "pg")]
        cmd += ["--out", str(run / f"rank{rank}.json"), *extra]
        if step is not None:
            cmd += ["--step", str(step)]
        if tier is not None:
            cmd += ["--tier", tier]
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd,
                env={k: v for k, v in rank_vars.items() if v is not None},
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
        return Ranks([], logs)
    assert codes == [0] * world, logs
    return Ranks([json.loads((run / f"rank{i}.json").read_text()) for i in range(world)], logs)


async def ranks(
    stack: Stack, tmp: Path, action: str, job: str, **kwargs: Any
) -> list[dict[str, Any]]:
    """The reports of ranks that must succeed."""
    return (await run_ranks(stack, tmp, action, job, **kwargs)).reports


async def wait_everywhere(
    stack: Stack, job: str, step: int, tiers: tuple[str, ...] = TIERS
) -> Checkpoint:
    """The checkpoint once it is restorable on each of `tiers`."""
    cp = None
    for tier in tiers:
        cp = await stack.wait_restorable(job, step, tier, WAIT)
    detail = await asyncio.to_thread(stack.client.checkpoint, job, step)
    assert cp is not None and detail.shards is not None
    return detail


def wipe_local(stack: Stack, job: str) -> None:
    for node in stack.nodes:
        shutil.rmtree(stack.local_dir(node, job, 0).parent, ignore_errors=True)


def s3_key(cp: Checkpoint, path: str) -> tuple[str, str]:
    shard = next(s for s in cp.shards or () if s.path == path)
    replica = next(r for r in shard.replicas if r.tier == "s3")
    assert replica.bucket is not None and replica.key is not None
    return replica.bucket, replica.key


def corrupt_s3(stack: Stack, cp: Checkpoint, path: str, *, everywhere: bool = False) -> None:
    s3 = stack.settings.tier("s3")
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region)
    bucket, key = s3_key(cp, path)
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=_flipped(data, everywhere))


def corrupt_file(path: Path, *, everywhere: bool = False) -> None:
    """Same size: only the checksum can tell."""
    path.write_bytes(_flipped(path.read_bytes(), everywhere))


def _flipped(data: bytes, everywhere: bool) -> bytes:
    if everywhere:
        return bytes(b ^ 0xFF for b in data)
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


def assert_loaded(reports: list[dict[str, Any]], step: int) -> None:
    for r in reports:
        assert r["step"] == step, r
        assert r["mismatches"] == [], r
        assert r["lease_released"], r


async def until_event(stack: Stack, job: str, step: int, want: tuple[str, str]) -> None:
    """Wait (hang guard: WAIT) until the checkpoint's history has an event (kind, tier)."""
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with (
        asyncio.timeout(WAIT),
        httpx.AsyncClient(base_url=stack.api_url, headers=headers) as api,
    ):
        while True:
            r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}/events", params={"limit": 1000})
            assert r.status_code == 200, r.text
            if want in {(e["kind"], e["tier"]) for e in r.json()["items"]}:
                return
            await asyncio.sleep(0.5)
