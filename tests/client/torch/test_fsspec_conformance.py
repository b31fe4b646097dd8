"""What a trainer relies on from a `tierpoint://` filesystem, each as the trainer meets it, on the
real stack (fs_scenarios.py runs the calls in the torch venv): DCP's commit is the rename to
`.metadata`; a listing shows committed, restorable steps only (torchtitan resumes from the newest
step folder holding `.metadata`); `rm -r` of a step is a purge retention carries out; reads seek
anywhere and get verified bytes; full URLs and stripped paths are the same path; Lightning's
transactions put a file in place only when they commit."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from tests.client.torch.ranks import (
    TORCH_PYTHON,
    WAIT,
    corrupt_file,
    new_job,
    rank_env,
    wait_everywhere,
)
from tests.helpers.client import Stack

SCRIPT = Path(__file__).with_name("fs_scenarios.py")
DATA = "__0_0.distcp"
SIZE = 300_000


async def scenario(stack: Stack, tmp: Path, name: str, job: str, *steps: int) -> dict[str, Any]:
    out = tmp / f"{name}-{uuid.uuid4().hex[:8]}.json"
    cmd = [str(TORCH_PYTHON), str(SCRIPT), name, "--job", job, "--out", str(out), "--steps"]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        *map(str, steps),
        env=rank_env(stack) | {"TIERPOINT_NODE": stack.nodes[0]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    logs, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, logs.decode(errors="replace")
    facts: dict[str, Any] = json.loads(out.read_text())
    return facts


async def test_the_rename_to_metadata_is_the_commit(stack: Stack, tmp_path: Path) -> None:
    job = new_job("fs")
    facts = await scenario(stack, tmp_path, "commit", job, 1)
    # Every file written and closed, `.metadata.tmp` too: nothing registered, nothing visible.
    assert facts["before"] == {"registered": None, "metadata_exists": False}
    node = stack.nodes[0]
    metadata = (stack.local_dir(node, job, 1) / ".metadata").stat().st_size
    assert facts["after"] == {DATA: [SIZE, node], ".metadata": [metadata, node]}
    assert {p.name for p in stack.local_dir(node, job, 1).iterdir()} == {DATA, ".metadata"}


async def test_a_listing_shows_only_committed_restorable_steps_in_both_path_forms(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("fs")
    await scenario(stack, tmp_path, "commit", job, 2)
    await wait_everywhere(stack, job, 2, ("ssd",))
    # A newer step whose save died before its commit: its data file is on the local tier.
    staged = await scenario(stack, tmp_path, "stage", job, 4)
    assert (stack.local_dir(stack.nodes[0], job, 4) / DATA).exists()
    # A save without collectives (per-rank metadata) cannot commit either: it fails, loudly.
    assert "writes per-rank metadata" in staged["per_rank_commit"], staged
    facts = await scenario(stack, tmp_path, "listing", job, 2, 4)
    metadata = (stack.local_dir(stack.nodes[0], job, 2) / ".metadata").stat().st_size
    for form in (f"tierpoint://{job}", job):
        assert facts[form] == {
            "exists": True,
            "isdir": True,
            "ls": [f"{job}/step-2"],  # stripped names, as fsspec's own filesystems answer
            "step_isdir": True,
            "step_ls": [
                {"name": f"{job}/step-2/.metadata", "size": metadata, "type": "file"},
                {"name": f"{job}/step-2/{DATA}", "size": SIZE, "type": "file"},
            ],
            "metadata_isfile": True,
            "uncommitted_exists": False,
            "uncommitted_metadata": False,
            "load_step": 2,  # torchtitan resumes from step 2, never the half-written step 4
        }, form
    assert facts["other_job_exists"] is False
    for probe, result in facts["refused"].items():
        assert result.startswith("AuthError: "), (probe, result)


async def test_random_access_reads_are_verified_and_fall_back_to_the_next_copy(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("fs")
    await scenario(stack, tmp_path, "commit", job, 3)
    await wait_everywhere(stack, job, 3, ("ssd", "lustre"))
    want = {"mismatches": [], "whole": True, "metadata_names": [DATA], "warnings": []}
    assert await scenario(stack, tmp_path, "reads", job, 3) == want
    # The node's own copy rots (same size): the reads get the shared tier's verified bytes.
    corrupt_file(stack.local_dir(stack.nodes[0], job, 3) / DATA)
    facts = await scenario(stack, tmp_path, "reads", job, 3)
    assert {k: v for k, v in facts.items() if k != "warnings"} == {
        k: v for k, v in want.items() if k != "warnings"
    }
    (warning,) = facts["warnings"]
    assert f"{DATA}" in warning and "failed verification" in warning, warning


async def test_rm_r_of_a_step_is_a_purge_that_retention_carries_out(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("fs")
    for step in (5, 6):
        await scenario(stack, tmp_path, "commit", job, step)
        await wait_everywhere(stack, job, step)
    facts = await scenario(stack, tmp_path, "purge", job, 5, 6)
    assert facts["committed_file"].startswith("PermissionError: ")
    assert facts["newest"].startswith("ConflictError: "), facts
    assert "the job's newest restorable checkpoint" in facts["newest"]
    assert facts["missing"].startswith("FileNotFoundError: ")  # torchtitan ignores it
    assert facts["old"] == "ok"
    assert facts["ls"] == [f"{job}/step-6"]
    # Retention deletes its copies: every tier copy expired, its local files gone.
    async with asyncio.timeout(WAIT):
        while True:
            cp = await asyncio.to_thread(stack.client.checkpoint, job, 5)
            if {t.state for t in cp.tiers} == {"expired"}:
                break
            await asyncio.sleep(0.3)
    assert not stack.local_dir(stack.nodes[0], job, 5).exists()
    assert (stack.local_dir(stack.nodes[0], job, 6) / DATA).exists()


async def test_a_transaction_puts_its_files_in_place_only_when_it_commits(
    stack: Stack, tmp_path: Path
) -> None:
    facts = await scenario(stack, tmp_path, "transaction", new_job("fs"), 7)
    assert "state.ckpt" not in facts["in_transaction"], facts  # staged under a temporary name
    assert len(facts["in_transaction"]) == 1
    assert facts["committed"] == ["state.ckpt"]
    assert facts["registered"] == ["state.ckpt"]  # the commit registered the step
    assert facts["after_discard"] == []  # the failed one left nothing
    assert facts["bytes_ok"] is True
