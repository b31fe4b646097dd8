"""Threads started on an activity's thread survive the SDK's cancellation (apps/worker_threads.py).

A process of its own cancels, hundreds of times, a synchronous activity that does nothing but
start pool threads, through the SDK's own cancellation (`ActivityEnvironment.cancel`, the raise
into the activity's thread that a worker does on a heartbeat timeout). With the shield every
cancellation ends its activity. Without it, on CPython 3.11, one of them lands in a thread being
started and the activity, and with it every pool of the process, waits forever: the control.
It runs in a process of its own because what it breaks is process-wide."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.worker_threads import shield_thread_starts, shielded
from tests.helpers.worker_process import REPO

pytestmark = pytest.mark.full_stack

CANCELLATIONS = 300

SCRIPT = """
import os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from apps.worker_threads import shield_thread_starts

if sys.argv[1] == "shielded":
    shield_thread_starts()


@activity.defn
def start_threads() -> None:
    while True:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(int).result()


for i in range(int(sys.argv[2])):
    env = ActivityEnvironment()
    ended = threading.Event()

    def run() -> None:
        try:
            env.run(start_threads)
        except BaseException:
            pass
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    time.sleep(0.003)
    env.cancel()
    if not ended.wait(10):
        print(f"stuck after {i} cancellations", flush=True)
        os._exit(3)
print("every cancellation ended its activity", flush=True)
"""


def _cancel_many(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(CANCELLATIONS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_cancellation_ends_an_activity_that_starts_threads() -> None:
    done = _cancel_many("shielded")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "every cancellation ended its activity" in done.stdout


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="the new thread carries its starter's id until it runs on CPython 3.11",
)
def test_without_the_shield_a_cancellation_kills_a_starting_thread_and_the_pool_waits() -> None:
    done = _cancel_many("unshielded")
    assert done.returncode == 3, done.stdout + done.stderr[-2000:]
    assert "stuck after" in done.stdout
    assert "Exception ignored in thread started by" in done.stderr


def test_outside_an_activity_a_thread_starts_as_before() -> None:
    shield_thread_starts()
    assert shielded()
    ran: list[int] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        ran += pool.map(abs, [-1, -2])
    assert ran == [1, 2]
