"""What a load keeps of other nodes' files on a node's local tier is deleted with the checkpoint's
local copy: "we delete only what we registered" stays true because the files are recorded first.

Two real ranks (`.venv-torch`, gloo) save a checkpoint, then restart on each other's node: each
reads the other node's file from the shared tier and keeps it on its own node (as the reader
always has), which the coordinator now records first, in one request for both. A retention that
keeps one local copy then expires that step's local copy: the kept files go with each node's
own, the job's unregistered file beside them stays, nothing of the next step or of the shared
tier is touched, and the delete no longer reports the reader's own files as unregistered ones
kept. Before, nothing recorded them: they stayed on both nodes for good, and the log warned of
"unregistered files kept ... __1_0.distcp" after an ordinary resume."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.client.torch.ranks import WAIT, assert_loaded, new_job, ranks, wait_everywhere
from tests.helpers.client import Stack

KEEP_ONE_LOCAL = {"kinds": {"local": {"keep_last": 1}}}


async def _keep_one_local_copy(stack: Stack, job: str) -> None:
    """Assign the policy to the job: assigning it runs the job's retention."""
    headers = {"authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as http:
        r = await http.post(
            "/v1/policies", json={"name": f"one-local-{job}", "spec": KEEP_ONE_LOCAL}
        )
        assert r.status_code == 201, r.text
        r = await http.put(f"/v1/jobs/{job}/policy", json={"policy": f"one-local-{job}"})
        assert r.status_code == 200, r.text


async def _until_local_expired(stack: Stack, job: str, step: int) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        cp = await asyncio.to_thread(stack.client.checkpoint, job, step)
        states = {t.tier: t.state for t in cp.tiers}
        if states["ssd"] == "expired":
            return
        assert time.monotonic() < deadline, states
        await asyncio.sleep(0.2)


def _names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


async def test_files_a_load_keeps_of_other_nodes_expire_with_the_local_copy(
    stack: Stack, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    node_a, node_b = stack.nodes
    job = new_job("kept")
    await ranks(stack, tmp_path, "save", job, world=2, step=1)
    await wait_everywhere(stack, job, 1)
    a1, b1 = stack.local_dir(node_a, job, 1), stack.local_dir(node_b, job, 1)
    assert _names(a1) == {".metadata", "__0_0.distcp"} and _names(b1) == {"__1_0.distcp"}

    # The ranks restart on each other's node: each keeps the other node's file it read.
    swapped = await ranks(stack, tmp_path, "load", job, world=2, nodes=(node_b, node_a))
    assert_loaded(swapped, 1)
    assert sorted(swapped[0]["stats"]["repopulated"]) == [".metadata", "__0_0.distcp"]
    assert swapped[1]["stats"]["repopulated"] == ["__1_0.distcp"]
    assert _names(a1) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert _names(b1) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    # They are no copies in the catalog: each file's local copy is its own node's only.
    detail = await asyncio.to_thread(stack.client.checkpoint, job, 1)
    local = {s.path: {r.node for r in s.replicas if r.tier == "ssd"} for s in detail.shards or ()}
    assert local == {".metadata": {node_a}, "__0_0.distcp": {node_a}, "__1_0.distcp": {node_b}}
    # A file the job wrote beside its shards, which tierpoint never registered.
    (a1 / "notes.txt").write_text("the job's own")

    await ranks(stack, tmp_path, "save", job, world=2, step=2)
    await wait_everywhere(stack, job, 2)
    a2, b2 = stack.local_dir(node_a, job, 2), stack.local_dir(node_b, job, 2)
    before = {p: p.read_bytes() for d in (a2, b2, stack.shared_dir(job, 1)) for p in d.iterdir()}
    capfd.readouterr()
    await _keep_one_local_copy(stack, job)
    await _until_local_expired(stack, job, 1)

    # Step 1's local copy is gone on both nodes, the files kept there with it; the job's own
    # unregistered file stays, and so does its directory.
    assert _names(a1) == {"notes.txt"}
    assert not b1.exists()
    assert (a1 / "notes.txt").read_text() == "the job's own"
    # Nothing else was touched: step 2 on both nodes, step 1 on the shared tier.
    assert {p: p.read_bytes() for p in before} == before
    logged = capfd.readouterr()
    kept = [
        line
        for line in (logged.out + logged.err).splitlines()
        if "unregistered files kept" in line and job in line
    ]
    # Reported: the job's own file only, never a file the reader kept.
    assert len(kept) == 1 and "notes.txt" in kept[0] and ".distcp" not in kept[0], kept
