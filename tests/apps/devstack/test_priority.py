"""The dev stack's workers yield the CPU (apps/devstack/priority.py): every thread of the process
goes to the workers' nice value, threads started afterwards inherit it, and a process started
lower than that stays where it was. Each case is a real process of its own, so the test's own
priority never changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.devstack.priority import WORKER_NICE

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
