"""The dev stack's workers yield the CPU (apps/devstack/priority.py): every thread of the process
goes to the workers' nice value, threads started afterwards inherit it, and a process started
lower than that stays where it was. A service in a session of its own (Temporal, moto) goes to
it with every thread it has, and so does its session's scheduling group where Linux has one.
Each case is a real process of its own, so the test's own priority never changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.devstack.priority import WORKER_NICE, lower_service_priority

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

ROOT = Path(__file__).resolve().parents[3]

# A thread that exists before the call, the call, then a thread started after it; each reports
# the nice value the kernel holds for it.
CHILD = """
import json, os, threading
from apps.devstack.priority import lower_own_priority

def nice():
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

before_ready, release = threading.Event(), threading.Event()
seen = {}
def early():
    before_ready.set()
    release.wait()
    seen["early"] = nice()
t = threading.Thread(target=early)
t.start()
before_ready.wait()
lower_own_priority()
release.set()
t.join()
late = threading.Thread(target=lambda: seen.__setitem__("late", nice()))
late.start()
late.join()
seen["main"] = nice()
print(json.dumps(seen))
"""


def _run(start_nice: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: os.nice(start_nice),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen: dict[str, int] = json.loads(out.stdout)
    return seen


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux: a nice value per thread")
def test_every_thread_runs_at_the_workers_nice_those_started_later_too() -> None:
    assert os.getpriority(os.PRIO_PROCESS, 0) < WORKER_NICE, "run the test above the workers"
    assert _run(0) == {"early": WORKER_NICE, "late": WORKER_NICE, "main": WORKER_NICE}


def test_a_process_started_lower_stays_lower() -> None:
    lower = WORKER_NICE + 5
    assert _run(lower) == {"early": lower, "late": lower, "main": lower}


# A service as the stack starts one: a session of its own, threads running before it is lowered.
SERVICE = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("up", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux: a nice value per thread")
def test_a_service_in_a_session_of_its_own_yields_with_every_thread_and_its_group() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        grouped = lower_service_priority(proc.pid)
        tasks = Path(f"/proc/{proc.pid}/task")
        nices = {int(t.name): os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in tasks.iterdir()}
        assert len(nices) == 4, nices
        assert set(nices.values()) == {WORKER_NICE}, nices
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        assert grouped == autogroup.exists()
        if grouped:
            # "/autogroup-42 nice 10"
            assert autogroup.read_text().split()[-1] == str(WORKER_NICE)
    finally:
        proc.kill()
        proc.wait(10)
