"""The DCP reader and writer on a run's timeline, as a training script meets it, against the real
stack: a job's first run loads nothing without an exception; a run that loads an earlier step
with `rollback=True` saves the steps after it again (in the new branch's own directory), each
checkpoint naming the one the run loaded, then the one it saved, as its parent; without the
rollback the save is refused with a message that says how to roll back; `health="good"` loads
the newest certified good checkpoint; a forked job's first load reads its parent's checkpoint
where it is, and a corrupt copy found there is reported on the parent's checkpoint."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
from tierpoint_client import CheckpointRef

from tests.client.torch.ranks import TORCH_PYTHON, WAIT, rank_env
from tests.helpers.client import Stack

SCRIPT = Path(__file__).with_name("timeline_rank.py")


async def _run(stack: Stack, tmp: Path, job: str, *args: str) -> dict[str, Any]:
    out = tmp / f"run-{uuid.uuid4().hex[:8]}.json"
    env = rank_env(stack) | {"TIERPOINT_NODE": stack.nodes[0]}
    proc = await asyncio.create_subprocess_exec(
        str(TORCH_PYTHON),
        str(SCRIPT),
        "--job",
        job,
        "--out",
        str(out),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    logs, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, logs.decode(errors="replace")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


async def _restorable(stack: Stack, job: str, *steps: int) -> None:
    for step in steps:
        await stack.wait_restorable(job, step, "lustre", WAIT)


async def test_a_first_run_loads_nothing_and_raises_nothing(stack: Stack, tmp_path: Path) -> None:
    job = f"first-{uuid.uuid4().hex[:8]}"
    report = await _run(stack, tmp_path, job, "--load", "--save", "10")
    assert report["loaded"] is None and report["state_untouched"], report
    assert report["saved"] == [[10, 1, None, None]], report
    # Plain dcp.load still says why, inside DCP's own exception.
    other = f"first-{uuid.uuid4().hex[:8]}"
    plain = await _run(stack, tmp_path, other, "--plain")
    [error] = plain["plain_error"]
    assert "no_restorable_checkpoint" in error and plain["state_untouched"], plain


async def test_a_load_that_rolls_back_saves_the_steps_after_it_again(
    stack: Stack, tmp_path: Path
) -> None:
    job = f"roll-{uuid.uuid4().hex[:8]}"
    first = await _run(stack, tmp_path, job, "--save", "10", "--save", "20")
    assert [s[0] for s in first["saved"]] == [10, 20]
    await _restorable(stack, job, 10, 20)

    # Loading step 10 and saving 20 again without a rollback: refused, and told how.
    naive = await _run(stack, tmp_path, job, "--load", "--step", "10", "--save", "20")
    assert naive["loaded"] == 10 and naive["right_state"], naive
    step, code, message = naive["save_refused"]
    assert (step, code) == (20, "checkpoint_conflict") and "rollback=True" in message

    again = await _run(
        stack, tmp_path, job, "--load", "--step", "10", "--rollback", "--save", "20", "--save", "30"
    )
    assert again["loaded"] == 10 and again["right_state"], again
    # On branch 2, the first save's parent is what the run loaded, the next one's its last save.
    assert again["saved"] == [[20, 2, 10, 1], [30, 2, 20, 2]], again
    node_dir = stack.local_dir(stack.nodes[0], job, 20).parent
    assert (node_dir / "20" / ".metadata").is_file() and (
        node_dir / "20.b2" / ".metadata"
    ).is_file()
    await _restorable(stack, job, 30)
    latest = await asyncio.to_thread(stack.client.latest, job)
    assert latest is not None and (latest.step, latest.checkpoint.branch) == (30, 2)
    old = await asyncio.to_thread(stack.client.checkpoint, job, 20, branch=1)
    assert old.superseded_by == 2

    # A restart loads the new branch's latest and saves on it: no rollback, no refusal.
    resumed = await _run(stack, tmp_path, job, "--load", "--save", "40")
    assert resumed["loaded_ref"] == [job, 30, 2] and resumed["saved"] == [[40, 2, 30, 2]], resumed


async def test_health_good_loads_the_newest_certified_checkpoint(
    stack: Stack, tmp_path: Path
) -> None:
    job = f"good-{uuid.uuid4().hex[:8]}"
    await _run(stack, tmp_path, job, "--save", "10", "--save", "20")
    await _restorable(stack, job, 10, 20)
    none = await _run(stack, tmp_path, job, "--load", "--health", "good")
    assert none["loaded"] is None, none
    await asyncio.to_thread(stack.client.give_verdict, job, 10, "good")
    good = await _run(stack, tmp_path, job, "--load", "--health", "good")
    assert good["loaded_ref"] == [job, 10, 1] and good["right_state"], good


async def test_a_forks_first_load_reads_the_parent_and_reports_its_corrupt_copy_there(
    stack: Stack, tmp_path: Path
) -> None:
    parent, child = f"pre-{uuid.uuid4().hex[:8]}", f"tune-{uuid.uuid4().hex[:8]}"
    await _run(stack, tmp_path, parent, "--save", "10")
    await _restorable(stack, parent, 10)
    await asyncio.to_thread(stack.client.fork, child, CheckpointRef(parent, 10))
    # Rot the parent's node-local copy of its data files: the load reads it first.
    local = stack.local_dir(stack.nodes[0], parent, 10)
    rotten = sorted(p.name for p in local.iterdir() if p.name != ".metadata")
    assert rotten
    for name in rotten:
        data = bytearray((local / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (local / name).write_bytes(bytes(data))

    first = await _run(stack, tmp_path, child, "--load")
    # The parent's bytes, read from another copy, under the parent's name.
    assert first["loaded_ref"] == [parent, 10, 1] and first["right_state"], first

    # The report names the parent's checkpoint: its history has it (made during the load, before
    # the load went on to the next copy). Whether the server's re-read then finds the copy bad
    # depends on whether it reads before the load writes the verified bytes back over it.
    reported = await asyncio.to_thread(_events, stack, parent, 10, "corrupt_reported")
    assert sorted((e["tier"], e["detail"]["path"]) for e in reported) == [
        ("ssd", name) for name in rotten
    ], reported


def _events(stack: Stack, job: str, step: int, kind: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{stack.api_url}/v1/jobs/{job}/checkpoints/{step}/events",
        headers={"authorization": f"Bearer {stack.token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return [e for e in r.json()["items"] if e["kind"] == kind]
