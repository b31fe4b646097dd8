"""Running torchtitan's own trainer (examples/torchtitan/cpu_launch.py under torchrun) in
`.venv-trainers` against the client test stack, and reading what it logged."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.client.torch.ranks import WAIT, rank_env
from tests.helpers.client import Stack

ROOT = Path(__file__).resolve().parents[3]
TRAINERS_VENV = ROOT / ".venv-trainers"
TRAINERS_PYTHON = TRAINERS_VENV / "bin" / "python"
LAUNCHER = ROOT / "examples" / "torchtitan" / "cpu_launch.py"
MAKE_ASSETS = ROOT / "examples" / "torchtitan" / "make_assets.py"
# Every run's learning-rate schedule, whatever its length: without it a resumed run's schedule
# (built from --training.steps) differs from the uninterrupted run's, and so do its losses.
TOTAL_STEPS = 12

_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")
_LOADED = re.compile(r"Loading the checkpoint from \S*/step-(\d+)")
_TEARDOWN = "Process group destroyed"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def make_workdir(work: Path) -> Path:
    """A folder torchtitan starts in, holding the test assets its debug model reads."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(TRAINERS_PYTHON), str(MAKE_ASSETS), str(work)], check=True, timeout=WAIT)
    return work


def titan_flags(world: int, steps: int, folder: str | None) -> list[str]:
    flags = ["--module", "llama3", "--config", "llama3_debugmodel"]
    flags += ["--dump-folder", "out", "--training.steps", str(steps)]
    flags += ["--training.seq-len", "256", "--training.local-batch-size", "2"]
    flags += ["--lr-scheduler.total-steps", str(TOTAL_STEPS)]
    flags += ["--validator.no-enable", "--metrics.disable-color-printing"]
    flags += ["--debug.seed", "42", "--debug.deterministic"]
    if world > 1:
        flags += ["--parallelism.spmd-backend", "partial_dtensor"]
    if folder is not None:
        flags += ["--checkpoint.enable", "--checkpoint.folder", folder]
        flags += ["--checkpoint.interval", "2"]
    return flags


@dataclass
class Run:
    proc: asyncio.subprocess.Process
    log: Path

    def text(self) -> str:
        return _ANSI.sub("", self.log.read_text(errors="replace"))

    def losses(self) -> dict[int, str]:
        """Each step's logged loss, as printed (the same on every rank that logs it)."""
        found: dict[int, set[str]] = {}
        for step, loss in _LOSS.findall(self.text()):
            found.setdefault(int(step), set()).add(loss)
        assert all(len(v) == 1 for v in found.values()), found
        return {step: next(iter(v)) for step, v in found.items()}

    def loaded_step(self) -> int | None:
        found = [int(s) for s in _LOADED.findall(self.text())]
        assert len(set(found)) <= 1, found
        return found[0] if found else None

    async def wait(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), WAIT)

    def kill(self) -> None:
        """SIGKILL to every rank and to torchrun, as a node's failure ends them: nothing of
        theirs runs on. torchrun starts each rank in a session of its own, so the ranks are
        found as its children."""
        ranks = _children(self.proc.pid)
        assert ranks, "torchrun has no ranks to kill"
        for pid in [*ranks, self.proc.pid]:
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


async def start(
    stack: Stack, work: Path, name: str, *, world: int, steps: int, folder: str | None
) -> Run:
    """torchrun with `world` ranks on the stack's first node, in its own process group."""
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = rank_env(stack) | {
        "TIERPOINT_NODE": stack.nodes[0],
        "HF_HOME": str(work / "hf"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "TMPDIR": str(tmp),
    }
    cmd = [str(TRAINERS_PYTHON), "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={world}", str(LAUNCHER), *titan_flags(world, steps, folder)]
    log = work / f"{name}.log"
    with await asyncio.to_thread(log.open, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=work,
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    return Run(proc, log)


async def run(
    stack: Stack, work: Path, name: str, *, world: int, steps: int, folder: str | None
) -> Run:
    """A run that must complete."""
    done = await start(stack, work, name, world=world, steps=steps, folder=folder)
    code = await done.wait()
    last = [s for s, _ in _LOSS.findall(done.text()) if int(s) == steps]
    if code != 0 and folder is None and len(last) == world and _TEARDOWN in done.text():
        # The reference run saves nothing (no tierpoint in it) and only its losses are compared:
        # every rank logged its last step, and gloo's threads aborting a rank after its group was
        # destroyed ("terminate called without an active exception") are torch's, not ours.
        return done
    assert code == 0, done.text()[-8000:]
    return done
