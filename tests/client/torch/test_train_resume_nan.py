"""examples/train_resume when the loss goes NaN after a resume, run for real (torchrun, two ranks,
each its own node): the guard marks the checkpoint the run loaded bad and the ranks exit with its
code; a restart never loads that checkpoint again; `--load good --rollback` walks back to the
newest checkpoint certified good, rolls the job back to it, and trains and saves the steps after
it again on a new branch, bit-identical to the first time they were trained; `latest` follows
the new branch and the lineage shows the branch point."""

from __future__ import annotations

import asyncio
import re

from tierpoint_client.guard import GUARD_EXIT_CODE

from tests.client.torch.ranks import WAIT, new_job
from tests.client.torch.test_train_resume import RESUMED, SAVED, Training
from tests.helpers.client import Stack

GUARD = re.compile(r"^tierpoint guard: (.*)$", re.M)


async def _run(stack: Stack, job: str, *args: str) -> str:
    return await (await Training.start(stack, None, job, "--step-time", "0", *args)).finish()


async def _fails(stack: Stack, job: str, *args: str) -> str:
    run = await Training.start(stack, None, job, "--step-time", "0", *args)
    code = await asyncio.wait_for(run.proc.wait(), WAIT)
    await asyncio.wait_for(run.reader, WAIT)
    assert code != 0, run.output
    return run.output


async def _restorable(stack: Stack, job: str, *steps: int) -> None:
    for step in steps:
        await stack.wait_restorable(job, step, "lustre", WAIT)


async def test_a_nan_after_a_resume_is_rolled_back_to_the_newest_good_checkpoint(
    stack: Stack,
) -> None:
    client, job = stack.client, new_job("nan")
    first = await _run(stack, job, "--steps", "10")
    assert "no restorable checkpoint, starting from step 0" in first
    await _restorable(stack, job, 5, 10)

    # A resume whose next steps are healthy: the guard certifies what it loaded.
    second = await _run(stack, job, "--steps", "20", "--guard-steps", "3")
    assert [m[0] for m in RESUMED.findall(second)] == ["10"], second
    trained = {int(s): d for s, d in SAVED.findall(second)}
    await _restorable(stack, job, 15, 20)
    ten = await asyncio.to_thread(client.checkpoint, job, 10)
    assert ten.health is not None and ten.health.verdict == "good", ten

    # The loss goes NaN two steps after resuming from 20: 20 is marked bad, the ranks stop.
    third = await _fails(stack, job, "--steps", "30", "--guard-steps", "3", "--nan-at", "22")
    assert [m[0] for m in RESUMED.findall(third)] == ["20"], third
    assert any("marked" in g and f"{job}/20 bad" in g for g in GUARD.findall(third)), third
    assert f"exitcode  : {GUARD_EXIT_CODE}" in third or f"exitcode: {GUARD_EXIT_CODE}" in third
    twenty = await asyncio.to_thread(client.checkpoint, job, 20)
    assert twenty.health is not None and twenty.health.verdict == "bad", twenty
    assert twenty.health.at_step == 22 and twenty.quarantine_reason
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and latest.step == 15  # no restart loads 20 again

    # The restart walks back to the newest good checkpoint and rolls back to it.
    fourth = await _run(stack, job, "--steps", "30", "--load", "good", "--rollback")
    assert [m[0] for m in RESUMED.findall(fourth)] == ["10"], fourth
    again = {int(s): d for s, d in SAVED.findall(fourth)}
    assert sorted(again) == [15, 20, 25, 30], fourth
    assert {s: again[s] for s in (15, 20)} == {s: trained[s] for s in (15, 20)}
    await _restorable(stack, job, 30)
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and (latest.step, latest.checkpoint.branch) == (30, 2), latest
    old = await asyncio.to_thread(client.checkpoint, job, 20, branch=1)
    assert old.superseded_by == 2 and old.health is not None and old.health.verdict == "bad"
    lineage = await asyncio.to_thread(client.lineage, job, 15, branch=2)
    assert [(a.step, a.branch) for a in lineage.ancestors][:1] == [(10, 1)], lineage
