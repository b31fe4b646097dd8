"""The dev stack's CPU priorities: its workers yield the CPU to what serves a request.

`tierpoint dev` runs every node's worker in its own process and the API in another, on one
machine. Under a storm of checkpoints the workers' batch activities want every core, while a
registration is a few milliseconds of CPU that a training job waits for: measured on two cores
(docs/benchmarks.md, "Registration p99 in the storm"), a registration spent most of its time
runnable but not running. So once the API process has started (it keeps the priority it was
started with), the stack lowers its own threads to `WORKER_NICE`; the threads a worker starts
later inherit it from the thread that starts them (Linux keeps a nice value per thread). Where
the kernel groups threads by session first (Linux's autogroup), the API, in a session of its own,
is a group apart from the workers anyway, and the nice value ranks the workers against the rest
of the stack's session (the job or benchmark started beside it).

This is the dev stack's choice for one machine. A deployment runs the API and the workers on
separate machines (docs/deployment.md), where nothing here applies; where they must share one, the
service manager's own priority settings do this job (e.g. systemd's `Nice=`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# Nice 10 weighs a thread at about a tenth of one at nice 0 (the kernel's weights: 110 vs 1024):
# the API's requests run first, and the workers still get every cycle the API leaves idle.
WORKER_NICE = 10

_TASKS = Path("/proc/self/task")


def lower_own_priority(nice: int = WORKER_NICE) -> None:
    """Every thread of this process to at least `nice` (never raised: a process started lower
    stays lower, and raising needs a privilege the stack does not ask for)."""
    if not _TASKS.is_dir():  # not Linux: the nice value is the process's
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
        return
    for entry in _TASKS.iterdir():
        tid = int(entry.name)
        # A thread may end between the listing and the call.
        with contextlib.suppress(ProcessLookupError):
            current = os.getpriority(os.PRIO_PROCESS, tid)
            if current < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
