"""`tierpoint dev` runs its API in a process of its own, as production does: a registration is
answered while the process of every node's worker cannot run at all (here: SIGSTOPped, the
extreme of workers whose threads hold the GIL through a storm of checkpoints), and the lifecycle
takes the checkpoint over once the workers run again. SIGKILL of the stack takes its API down
with it (tests/apps/devstack/test_dev_killed.py). The workers yield the CPU to the API: every
thread of the workers' process, those its activities started included, runs at a lower priority
than the API's. Real processes, real signals."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest

from apps.devstack.priority import WORKER_NICE
from tests.apps.devstack.test_dev_stack_e2e import DevProcess, _tail, start_dev

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

RESTORABLE_TIMEOUT = 180.0  # a hang guard


@pytest.fixture
def dev() -> Iterator[DevProcess]:
    root = Path(tempfile.mkdtemp(prefix="tierpoint-api-process-"))
    root.chmod(0o755)  # the embedded Postgres runs as its own user when we are root
    stack = start_dev(root / "dev", root / "dev.log")
    try:
        yield stack
    finally:
        os.kill(stack.proc.pid, signal.SIGCONT)
        assert stack.interrupt() == 0, _tail(stack.log)
        shutil.rmtree(root, ignore_errors=True)


def _shard_body(dev: DevProcess, job: str, step: int) -> dict[str, object]:
    node, local = next(iter(dev.info.nodes.items()))
    data = os.urandom(64 * 1024)
    shard = Path(local) / job / str(step) / "rank-0.bin"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(data)
    return {
        "step": step,
        "shards": [
            {"path": "rank-0.bin", "size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
            | {"node": node}
        ],
    }


def _wait_restorable(dev: DevProcess, job: str, step: int) -> None:
    # The copies fan out from the sealed tier, so S3 may be restorable before the shared tier:
    # wait for every tier, not the last one.
    deadline = time.monotonic() + RESTORABLE_TIMEOUT
    with dev.api() as api:
        while True:
            tiers = {
                t["tier"]: t["state"]
                for t in api.get(f"/v1/jobs/{job}/checkpoints/{step}").json()["tiers"]
            }
            if set(tiers.values()) == {"restorable"}:
                return
            assert time.monotonic() < deadline, (tiers, _tail(dev.log))
            time.sleep(0.5)


def _api_pid(dev: DevProcess) -> int:
    children = Path(f"/proc/{dev.proc.pid}/task/{dev.proc.pid}/children").read_text().split()
    for child in children:
        if b"apps.devstack.api_process" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError(f"no API process among the stack's children {children}")


def _thread_nices(pid: int) -> dict[int, int]:
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        # The nice value is the 19th field; the name before it is in parentheses and may hold
        # spaces.
        stat = (task / "stat").read_text()
        nices[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return nices


def test_a_registration_is_answered_while_the_workers_process_is_stopped(dev: DevProcess) -> None:
    job, step = f"api-process-{uuid.uuid4().hex[:6]}", 1
    body = _shard_body(dev, job, step)

    os.kill(dev.proc.pid, signal.SIGSTOP)
    try:
        with dev.api() as api:  # its timeout is 30 s: an API in the stopped process never answers
            resp = api.post(f"/v1/jobs/{job}/checkpoints", json=body)
            assert resp.status_code == 201, resp.text
            assert resp.json()["step"] == step
            listed = api.get(f"/v1/jobs/{job}/checkpoints/{step}")
            assert listed.status_code == 200, listed.text
    finally:
        os.kill(dev.proc.pid, signal.SIGCONT)

    # The workers run again: the lifecycle that the API started takes the checkpoint to S3.
    _wait_restorable(dev, job, step)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads from /proc")
def test_the_workers_yield_the_cpu_to_the_api(dev: DevProcess) -> None:
    started_at = os.getpriority(os.PRIO_PROCESS, 0)
    assert started_at < WORKER_NICE, "run the test at a priority above the workers' own"
    # A checkpoint through every tier first: the threads that seal and copy it, started after
    # the stack lowered its priority, are among those checked.
    job, step = f"api-priority-{uuid.uuid4().hex[:6]}", 1
    with dev.api() as api:
        resp = api.post(f"/v1/jobs/{job}/checkpoints", json=_shard_body(dev, job, step))
        assert resp.status_code == 201, resp.text
    _wait_restorable(dev, job, step)

    workers = _thread_nices(dev.proc.pid)
    assert len(workers) > 1, workers
    assert set(workers.values()) == {WORKER_NICE}, workers
    api_threads = _thread_nices(_api_pid(dev))
    assert set(api_threads.values()) == {started_at}, api_threads
