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

Temporal's dev server and moto, which serve the workers' batches (and the API's lifecycle starts,
after its responses), go the same way: each runs in a session of its own, so under autogroup each
was a group as heavy as the API's, and a registration waited behind them. Their sessions' groups
and threads are lowered to `WORKER_NICE` once started (`lower_service_priority`): in a storm on
two cores a registration waited 6-8 ms for a core instead of 22-26 ms, and the storm ran no slower
(docs/benchmarks.md, "The storm on a quiet machine"). Postgres is left as it is: the API's
statements are its work too.

This is the dev stack's choice for one machine. A deployment runs the API and the workers on
separate machines (docs/deployment.md), where nothing here applies; where they must share one, the
service manager's own priority settings do this job (e.g. systemd's `Nice=`).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

# Nice 10 weighs a thread at about a tenth of one at nice 0 (the kernel's weights: 110 vs 1024):
# the API's requests run first, and the workers still get every cycle the API leaves idle.
WORKER_NICE = 10

_TASKS = Path("/proc/self/task")
# Without CAP_SYS_ADMIN the kernel takes one autogroup nice change per 100 ms (EAGAIN otherwise).
_AUTOGROUP_TRIES = 20
_AUTOGROUP_WAIT = 0.11


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


def lower_service_priority(pid: int, nice: int = WORKER_NICE) -> bool:
    """A service the stack started as the leader of a session of its own (Temporal, moto): every
    thread of it to at least `nice`, and its session's scheduling group (Linux's autogroup) to
    `nice`. True when the group was lowered; False where there is no autogroup (another OS, or
    `sched_autogroup_enabled` off: the threads' nice then ranks the service by itself) or the
    service has gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # PRIO_PGRP reaches every thread of the process group the service leads.
        if os.getpriority(os.PRIO_PGRP, pid) < nice:
            os.setpriority(os.PRIO_PGRP, pid, nice)
    autogroup = Path(f"/proc/{pid}/autogroup")
    for _ in range(_AUTOGROUP_TRIES):
        try:
            autogroup.write_text(f"{nice}\n")
            return True
        except BlockingIOError:
            time.sleep(_AUTOGROUP_WAIT)
        except OSError:  # no such file: no autogroup, or the process is gone
            return False
    return False
