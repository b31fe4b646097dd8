"""examples/train_resume, run for real: torchrun (two ranks, gloo, each rank its own node) trains
and checkpoints with async_save; the test SIGKILLs it mid-run once a checkpoint is restorable,
starts it again, and checks that it resumed from the latest checkpoint with the state saved there
and ends bit-identical to a run that was never interrupted.

Under two of PyTorch's CPU kernel sets: the machine's best (AVX-512 or AVX2 on x86) and the
portable `default` ones. Their float results differ in the last bits, so the digests differ from
one set (one machine) to another: what must hold under each is that the resumed run ends on the
uninterrupted run's digest, both measured here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.client.torch.ranks import ROOT, TORCH_VENV, WAIT, new_job, rank_env
from tests.helpers.client import Stack

EXAMPLE = ROOT / "examples" / "train_resume" / "train.py"
TORCHRUN = TORCH_VENV / "bin" / "torchrun"
EVERY = 5
SAVED = re.compile(r"^step (\d+): loss \S+, checkpointing \(state (\w+)\)$", re.M)
RESUMED = re.compile(r"^resumed from step (\d+) \(state (\w+); read (.*)\)$", re.M)
DONE = re.compile(r"^done at step (\d+) \(state (\w+)\)$", re.M)
KERNELS = re.compile(r"^torch \S+, CPU kernels (\w+)$", re.M)
# PyTorch's choice of CPU kernels (an empty value is "invalid", not "unset").
KERNELS_VAR = "ATEN_CPU_CAPABILITY"


class Training:
    """One `torchrun --standalone --nproc-per-node 2 train.py` in its own session, its output
    collected as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.output = ""
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, stack: Stack, kernels: str | None, job: str, *args: str) -> Training:
        env = rank_env(stack) | {
            "TIERPOINT_NODES": ",".join(stack.nodes),
            "GLOO_SOCKET_IFNAME": "lo",  # the ranks talk over loopback only
            "PYTHONUNBUFFERED": "1",
        }
        env.pop(KERNELS_VAR, None)  # unset: torch picks the machine's best
        if kernels is not None:
            env[KERNELS_VAR] = kernels
        cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLE)]
        cmd += ["--job", job, "--every", str(EVERY), *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output += line.decode(errors="replace")

    async def finish(self) -> str:
        code = await asyncio.wait_for(self.proc.wait(), WAIT)
        await asyncio.wait_for(self.reader, WAIT)
        assert code == 0, self.output
        return self.output

    async def kill(self) -> str:
        """SIGKILL torchrun and its ranks (each rank is in a session of its own) at once."""
        ranks = _children(self.proc.pid)
        for pid in [*ranks, self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), WAIT)
        await asyncio.wait_for(self.reader, WAIT)  # every writer of the pipe is gone
        while any(_alive(pid) for pid in ranks):  # noqa: ASYNC110 - no event for another's child
            await asyncio.sleep(0.05)
        return self.output


def _newest_step(stack: Stack, job: str) -> int:
    return next(stack.client.checkpoints(job, page_size=1)).step


def _children(pid: int) -> list[int]:
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone: its work has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("kernels", [None, "default"], ids=["best-kernels", "default-kernels"])
async def test_killed_training_resumes_from_the_latest_checkpoint_bit_identically(
    stack: Stack, kernels: str | None
) -> None:
    client = stack.client
    job = new_job("train")
    # So many steps that it cannot end on its own before the kill, however slow the machine.
    run = await Training.start(stack, kernels, job, "--steps", "100000", "--step-time", "0.05")
    try:
        while await asyncio.to_thread(client.latest, job, node=stack.nodes[0]) is None:
            assert run.proc.returncode is None, run.output
            await asyncio.sleep(0.2)
    finally:
        killed = await run.kill()

    # Every checkpoint the killed run registered becomes restorable (its files were complete when
    # it was registered); the newest one is what the next run must resume from.
    saved = {int(s): d for s, d in SAVED.findall(killed)}
    latest = 0
    while (newest := await asyncio.to_thread(_newest_step, stack, job)) != latest:
        latest = newest  # a registration the kill left in flight may still land: settle first
        await asyncio.to_thread(client.wait_restorable, job, latest, "lustre", WAIT, 0.2)
    assert latest in saved, killed

    final = str(latest + 2 * EVERY)
    again = await Training.start(stack, kernels, job, "--steps", final, "--step-time", "0")
    resumed = await again.finish()
    [(step, state, read)] = RESUMED.findall(resumed)
    assert (int(step), state) == (latest, saved[latest]), resumed
    assert "__0_0.distcp from ssd" in read, read  # rank 0's own file, from its node's local tier
    [(end, end_state)] = DONE.findall(resumed)
    assert end == final

    fresh = new_job("train")
    uninterrupted = await Training.start(
        stack, kernels, fresh, "--steps", final, "--step-time", "0"
    )
    straight = await uninterrupted.finish()
    assert "no restorable checkpoint, starting from step 0" in straight
    # Every run ran on the kernels asked for (a variable torch no longer read would test the
    # same kernels twice).
    used = {k for out in (killed, resumed, straight) for k in KERNELS.findall(out)}
    assert len(used) == 1, used
    if kernels is not None:
        assert used == {kernels.upper()}, used
    # The same seeds on CPU: every step the uninterrupted run saved matches the killed run's.
    straight_saved = {int(s): d for s, d in SAVED.findall(straight)}
    assert {s: saved[s] for s in saved if s in straight_saved} == {
        s: straight_saved[s] for s in saved if s in straight_saved
    }
    assert DONE.findall(straight) == [(final, end_state)], (straight, resumed)


@pytest.mark.full_stack  # runs the example as a process
def test_without_stack_env_it_says_what_to_set(tmp_path: Path) -> None:
    """Run as a newcomer does before `source stack.env`: one clear line, no KeyError."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPOINT_", "AWS_"))}
    env |= {"GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    ran = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "1", str(EXAMPLE)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    out = ran.stdout + ran.stderr
    assert ran.returncode != 0, out
    assert "KeyError" not in out, out
    assert "source .tierpoint/dev/stack.env" in out and "TIERPOINT_NODE" in out, out
