"""CPU seconds of running processes, from /proc: what tells a benchmark which process was busy
(a single-threaded moto near 1.0 core is the bottleneck, whatever the client does)."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        # The command name (field 2) may hold spaces and parentheses: split after the last ")".
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def cpu_seconds(pid: int, *, tree: bool = False) -> float:
    """User + system CPU of `pid` (all its threads) and of the children it has reaped; with
    `tree`, of its live descendants too (Postgres backends, a server's workers). 0 once gone."""
    pids = [pid]
    if tree:
        children = _children()
        i = 0
        while i < len(pids):
            pids += children.get(pids[i], [])
            i += 1
    total = 0
    for p in pids:
        fields = _stat(p)
        if fields is not None:
            # utime, stime, cutime, cstime: a descendant's time counts once, live or reaped.
            total += sum(int(f) for f in fields[11:15])
    return total / _TICK


def children_of(pid: int) -> list[int]:
    return _children().get(pid, [])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def sched_seconds(pid: int) -> tuple[float, float]:
    """(on a CPU, runnable but waiting for one) of `pid`'s live threads, from the scheduler's
    own accounting (/proc/PID/task/TID/schedstat): the wait is what a loaded machine adds to a
    request. A thread that ended takes its share with it, so compare spans of a process whose
    threads live on (a server's). (0, 0) once gone or where the kernel keeps no schedstat."""
    ran = waited = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0, 0.0
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue
        ran += int(fields[0])
        waited += int(fields[1])
    return ran / 1e9, waited / 1e9
