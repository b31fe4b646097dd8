"""`python -m tierpoint_client` against the real stack, as a job script would call it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

from tests.helpers.client import Stack, read_tree, write_shards


async def _run(stack: Stack, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tierpoint_client",
        "--api-url",
        stack.api_url,
        *args,
        env={**os.environ, "TIERPOINT_TOKEN": stack.token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_register_wait_latest_restore(stack: Stack, tmp_path: Path) -> None:
    node = stack.nodes[1]
    job, step = f"cli-{uuid.uuid4().hex[:10]}", 5
    directory = stack.local_dir(node, job, step)
    shards = write_shards(directory, {"w/0.bin": 100_000, "w/1.bin": 3})

    code, out, err = await _run(stack, "manifest", str(directory), "--node", node)
    assert code == 0, err
    assert [(e["path"], e["size"], e["node"]) for e in json.loads(out)] == [
        ("w/0.bin", 100_000, node),
        ("w/1.bin", 3, node),
    ]

    args = ["register", job, str(step), str(directory), "--node", node, "--metadata", '{"a": 1}']
    code, out, err = await _run(stack, *args)
    assert code == 0, err
    assert (json.loads(out)["step"], json.loads(out)["metadata"]) == (step, {"a": 1})

    code, out, err = await _run(stack, "wait", job, str(step), "s3")
    assert code == 0, err
    assert any(t["tier"] == "s3" and t["state"] == "restorable" for t in json.loads(out)["tiers"])

    code, out, err = await _run(stack, "latest", job, "--tier", "s3")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert {p["path"] for p in plan} == set(shards)
    assert {p["tier"] for p in plan} == {"s3"}

    dest = tmp_path / "dest"
    code, out, err = await _run(stack, "restore", job, str(dest), "--tier", "lustre")
    assert code == 0, err
    assert json.loads(out)["tiers_used"] == {"lustre": 2}
    assert read_tree(dest) == shards


async def test_cli_errors_exit_non_zero_with_the_problem(stack: Stack, tmp_path: Path) -> None:
    job = f"cli-{uuid.uuid4().hex[:10]}"
    code, out, err = await _run(stack, "latest", job)
    assert (code, out) == (4, "")
    assert "no restorable checkpoint" in err

    write_shards(tmp_path / "ck", {"x.bin": 10})
    args = ["register", job, "1", str(tmp_path / "ck"), "--node", "no-such-node"]
    code, _, err = await _run(stack, *args)
    assert code == 2
    assert "unknown_node" in err
