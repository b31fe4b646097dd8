"""torchtitan's own trainer, unmodified (examples/torchtitan/cpu_launch.py runs it on CPU),
checkpointing to `--checkpoint.folder tierpoint://<job>` on the real stack: killed with SIGKILL
once a save is registered, it resumes from tierpoint (from the local tier, then, the local tier
wiped, from the shared tiers) with the same losses as an uninterrupted run. One node: torchrun's
ranks all write that node's local tier."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tierpoint_client import NotFoundError

from tests.client.torch.ranks import WAIT, new_job, wait_everywhere, wipe_local
from tests.client.trainers.trainer import TOTAL_STEPS, Run, make_workdir, run, start
from tests.helpers.client import Stack

pytestmark = pytest.mark.full_stack


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workdir(tmp_path_factory.mktemp("titan"))


async def registered(stack: Stack, job: str, step: int) -> bool:
    try:
        await asyncio.to_thread(stack.client.checkpoint, job, step)
    except NotFoundError:
        return False
    return True


async def killed_after_a_save(stack: Stack, work: Path, job: str, world: int) -> tuple[Run, int]:
    """A run of TOTAL_STEPS killed (SIGKILL, every process) as soon as its first save (step 2)
    is registered; the newest step registered when it died."""
    trainer = await start(
        stack, work, f"{job}-killed", world=world, steps=TOTAL_STEPS, folder=f"tierpoint://{job}"
    )
    deadline = time.monotonic() + WAIT  # a hang guard only
    while not await registered(stack, job, 2):
        assert trainer.proc.returncode is None, trainer.text()[-8000:]
        assert time.monotonic() < deadline, trainer.text()[-8000:]
        await asyncio.sleep(0.05)
    trainer.kill()
    await trainer.wait()
    # Killed mid-run, not at its end (it would have saved its last step).
    assert "Training completed" not in trainer.text()
    newest = max(cp.step for cp in await asyncio.to_thread(list, stack.client.checkpoints(job)))
    assert newest + 4 <= TOTAL_STEPS, newest
    return trainer, newest


def same_losses(run: Run, reference: dict[int, str], steps: range) -> None:
    losses = run.losses()
    assert {s: losses.get(s) for s in steps} == {s: reference[s] for s in steps}


async def test_torchtitan_two_ranks_killed_after_a_save_resume_from_the_local_then_the_shared_tier(
    stack: Stack, workdir: Path
) -> None:
    job = new_job("titan")
    folder = f"tierpoint://{job}"
    killed, newest = await killed_after_a_save(stack, workdir, job, world=2)
    # What the resumes list is what is restorable: the killed run's newest save (a step it was
    # writing when it died is no checkpoint: unregistered, never listed).
    await wait_everywhere(stack, job, newest)

    first = await run(stack, workdir, f"{job}-local", world=2, steps=newest + 2, folder=folder)
    assert first.loaded_step() == newest
    # The first resume's last save, then no local copy of anything of the job on any node: the
    # second resume reads the shared tiers' copies.
    await wait_everywhere(stack, job, newest + 2)
    wipe_local(stack, job)
    second = await run(stack, workdir, f"{job}-shared", world=2, steps=newest + 4, folder=folder)
    assert second.loaded_step() == newest + 2

    straight = await run(stack, workdir, f"{job}-straight", world=2, steps=newest + 4, folder=None)
    reference = straight.losses()
    same_losses(killed, reference, range(1, newest + 1))
    same_losses(first, reference, range(newest + 1, newest + 3))
    same_losses(second, reference, range(newest + 3, newest + 5))
    # The resumed runs trained only the steps after the checkpoint they loaded.
    assert min(first.losses()) == newest + 1 and min(second.losses()) == newest + 3


async def test_torchtitan_one_rank_killed_after_a_save_resumes_with_the_same_losses(
    stack: Stack, workdir: Path
) -> None:
    job = new_job("titan1")
    killed, newest = await killed_after_a_save(stack, workdir, job, world=1)
    await wait_everywhere(stack, job, newest, ("ssd",))
    resumed = await run(
        stack, workdir, f"{job}-resumed", world=1, steps=newest + 2, folder=f"tierpoint://{job}"
    )
    assert resumed.loaded_step() == newest
    straight = await run(stack, workdir, f"{job}-straight", world=1, steps=newest + 2, folder=None)
    reference = straight.losses()
    same_losses(killed, reference, range(1, newest + 1))
    same_losses(resumed, reference, range(newest + 1, newest + 3))
    assert min(resumed.losses()) == newest + 1
