"""Shard names that URLs, S3 or shells treat specially, end to end on the real stack: registered,
copied down every tier, the local and shared copies expired, then restored from S3 (by the client,
and by the torch reader's sources) and from the shared tier, every file's bytes equal.

Locations are data, not URLs: an S3 copy is (bucket, key), a shard path the characters of a POSIX
name. One checkpoint holds one shard per character, so the stack runs one lifecycle for all."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import time
import uuid
from pathlib import Path

import crc32c
import httpx
from tierpoint_client import build_manifest

from tests.client.torch.ranks import TORCH_PYTHON, rank_env, require_torch_venv
from tests.helpers.cli import run_cli
from tests.helpers.client import Stack, read_tree, write_shards

WAIT = 300.0  # hang guard only: the machine is shared

# What each name tries: a URL parser cuts at '?' and '#', decodes '%xx' and '+'; S3 signs
# keys percent-encoded; shells split at spaces and ';' and glob '*?[]'; unicode has two spellings
# of 'é' (NFC and NFD), which POSIX and S3 keep apart; Windows drops a trailing dot.
NAMES = {
    "?": "model.safetensors?rank=0",
    "#": "w.bin#x",
    "# pair": "w.bin",
    "%": "p%41%2Fq%.bin",
    "+": "a+b.bin",
    "space": "sp ace .bin",
    ";": "semi;colon.bin",
    "NFC": "caf\u00e9.bin",
    "NFD": "cafe\u0301.bin",
    "trailing dot": "trailing.",
    "& =": "k=v&x=y",
    "@ :": "user@host:1",
    "shell": "$(x)~!'\"*[a]{b}<c>|`^.bin",
    "leading dash": "-rf",
    "dots": "...",
    "emoji": "\U0001f642.bin",
    "directory": "dir ?#%+;/inner.bin",
}


def _job() -> str:
    return f"names-{uuid.uuid4().hex[:10]}"


async def _expire_local_and_shared(stack: Stack, job: str, step: int) -> None:
    """A policy that keeps no local or shared copy, assigned to the job (which runs retention),
    then wait until both markers are expired."""
    name = f"s3-only-{job}"
    spec = {"kinds": {"local": {"keep_last": 0}, "shared": {"keep_last": 0}}}
    headers = {"authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as http:
        r = await http.post("/v1/policies", json={"name": name, "spec": spec})
        assert r.status_code == 201, r.text
        r = await http.put(f"/v1/jobs/{job}/policy", json={"policy": name})
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + WAIT
    while True:
        cp = await asyncio.to_thread(stack.client.checkpoint, job, step)
        states = {t.tier: t.state for t in cp.tiers}
        if states["ssd"] == states["lustre"] == "expired":
            return
        assert time.monotonic() < deadline, states
        await asyncio.sleep(0.2)


def _torch_reads(stack: Stack, job: str, step: int, tier: str) -> dict[str, list[object]]:
    """What the torch reader's sources return for every file, read in `.venv-torch`."""
    require_torch_venv()
    script = Path(__file__).with_name("torch") / "read_files.py"
    done = subprocess.run(
        [str(TORCH_PYTHON), str(script), job, str(step), tier],
        env=rank_env(stack),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[object]] = json.loads(done.stdout)
    return result


async def test_every_special_character_restores_from_s3_and_the_shared_tier(
    stack: Stack, tmp_path: Path
) -> None:
    client, node = stack.client, stack.nodes[0]
    job, step = _job(), 5
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {n: 1000 + i for i, n in enumerate(NAMES.values())})
    manifest = build_manifest(local, node)
    assert {s.path for s in manifest} == set(shards)
    await asyncio.to_thread(client.register_manifest, job, step, manifest)
    await asyncio.to_thread(client.wait_restorable, job, step, "s3", WAIT, 0.2)

    for tier in ("lustre", "s3"):
        result = await asyncio.to_thread(client.restore, job, tmp_path / tier, tier=tier)
        assert read_tree(tmp_path / tier) == shards, tier
        assert result.tiers_used == {tier: len(shards)}

    await _expire_local_and_shared(stack, job, step)
    assert not local.exists() and not stack.shared_dir(job, step).exists()

    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and latest.step == step
    prefix = stack.settings.tier("s3").prefix
    assert {(e.tier, e.bucket, e.key) for e in latest.plan} == {
        ("s3", stack.settings.tier("s3").bucket, f"{prefix}{job}/{step}/{p}") for p in shards
    }
    for how, only in (("only-s3", "s3"), ("any", None)):
        result = await asyncio.to_thread(client.restore, job, tmp_path / how, tier=only)
        assert read_tree(tmp_path / how) == shards, how
        assert result.tiers_used == {"s3": len(shards)}

    expected = {p: [len(d), f"{crc32c.crc32c(d):08x}"] for p, d in shards.items()}
    assert await asyncio.to_thread(_torch_reads, stack, job, step, "s3") == expected
    # Nothing was reported corrupt: every read got its own object.
    cp = await asyncio.to_thread(client.checkpoint, job, step)
    assert cp.shards is not None
    assert {r.state for s in cp.shards for r in s.replicas if r.tier == "s3"} == {"verified"}


# Names as long as a POSIX name may be (255 bytes), which every tier stores: a temp name made by
# adding a prefix and a suffix to them would be too long for the file system.
LONG_NAMES = (
    "l" * 220 + ".bin",  # 224 bytes, the shortest that a 32-byte prefix and suffix overflow
    "m" * 251 + ".bin",  # 255
    "\u00e9" * 125 + "tail.",  # 255 bytes in 130 characters
    "nested/" + "n" * 251 + ".bin",
)


async def test_names_of_255_bytes_restore_from_every_tier(stack: Stack, tmp_path: Path) -> None:
    client, node = stack.client, stack.nodes[0]
    job, step = _job(), 6
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, {n: 5000 + i for i, n in enumerate(LONG_NAMES)})
    assert max(len(p.rsplit("/", 1)[-1].encode()) for p in shards) == 255
    await asyncio.to_thread(client.register_manifest, job, step, build_manifest(local, node))
    await asyncio.to_thread(client.wait_restorable, job, step, "s3", WAIT, 0.2)

    # As a user runs it: from the shared tier (the plan's choice without a node).
    out = await run_cli(stack.api_url, "restore", job, str(tmp_path / "cli"), token=stack.token)
    assert out.exit_code == 0, out.output
    assert read_tree(tmp_path / "cli") == shards
    # And from Python, from each tier: this node's local copies, the shared tier, S3.
    for tier, on in (("ssd", node), ("lustre", None), ("s3", None)):
        result = await asyncio.to_thread(
            functools.partial(client.restore, job, tmp_path / tier, tier=tier, node=on)
        )
        assert read_tree(tmp_path / tier) == shards, tier
        assert result.tiers_used == {tier: len(shards)}
