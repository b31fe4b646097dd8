"""Threads started on an activity's thread start whole, whatever the SDK's cancellation does.

The Python SDK cancels a synchronous activity (a heartbeat timeout, a cancelled workflow) by
raising an exception into the activity's thread, found by the thread's id. On CPython 3.11 a
thread being started carries the id of the thread that starts it until it runs its first line,
and the raise goes to the newest thread with that id: the new one. It dies in its bootstrap, and
`Thread.start()` on the activity's thread waits for it forever while holding the process-wide
shutdown lock of `concurrent.futures`, so every later `submit` in the process waits behind it,
the SDK's own among them (it runs each activity through one). The worker takes no task again.
That stopped a node worker process of the 1,000-node benchmark after a burst of heartbeat
timeouts: 250 nodes' queues went quiet, and the checkpoint waited for copies no worker ran.

So a thread started on an activity's thread is started inside the SDK's shield
(`activity.shield_thread_cancel_exception`): a cancellation that arrives meanwhile is raised
right after the start, in the activity's thread, where it would have gone. The activities' own
pools and those of the libraries under them (S3 parts, stripe fetches and joins, read-backs)
all start threads, so the shield is put on `threading.Thread.start` itself, in worker processes
only (`shield_thread_starts`, called when a worker is built). Threads started elsewhere (a pool
thread, the event loop) are started as before: the SDK raises only into an activity's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from temporalio import activity

_original_start: Callable[[threading.Thread], None] | None = None


def _start(thread: threading.Thread) -> None:
    assert _original_start is not None
    if not activity.in_activity():
        _original_start(thread)
        return
    with activity.shield_thread_cancel_exception():
        _original_start(thread)


def shield_thread_starts() -> None:
    """Start every thread that an activity's thread starts inside the SDK's cancellation shield
    (once per process; later calls change nothing)."""
    global _original_start
    if _original_start is not None:
        return
    _original_start = threading.Thread.start
    setattr(threading.Thread, "start", _start)  # noqa: B010 - a method of the stdlib's class


def shielded() -> bool:
    start: Any = threading.Thread.start
    return start is _start
