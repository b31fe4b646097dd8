"""One `tierpoint dev` per data dir, and nothing left running by one that was killed.

The stack holds an exclusive `flock` on DIR/dev.pid (which names its pid) for as long as it runs:
the kernel releases it however the process ends, so a lock that cannot be taken means a running
stack, and a lock that can be taken means every earlier owner is gone. The stack records each
server it starts in DIR/dev.children.json (pid and start time, so a reused pid is never taken for
it). Temporal and moto also die with the stack (`die_with_parent`); the Postgres server cannot
(pg_ctl daemonizes it). The next owner of the data dir stops whatever the records and
postgres/postmaster.pid still name before it starts its own servers: never two servers on one
data dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from apps.devstack.paths import StackPaths
from apps.devstack.services import EmbeddedPostgres, create_time, stop_process

CHILDREN_FILE = "dev.children.json"


class DataDirBusy(RuntimeError):
    """Another running `tierpoint dev` owns the data dir."""


@dataclass
class DataDirClaim:
    paths: StackPaths
    _fd: int | None = field(default=None, init=False, repr=False)

    @property
    def children_file(self) -> Path:
        return self.paths.data_dir / CHILDREN_FILE

    def _records(self) -> dict[str, dict[str, float]]:
        with contextlib.suppress(FileNotFoundError, ValueError):
            data = json.loads(self.children_file.read_text())
            if isinstance(data, dict):
                return data
        return {}

    def acquire(self, postgres: EmbeddedPostgres) -> list[str]:
        """Own the data dir, or raise DataDirBusy naming the running owner and its servers. Stops
        what a killed owner left running; returns what it stopped ("temporal (pid 123)", ...)."""
        self.paths.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.paths.pid_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # guard: dev-two-stacks-one-data-dir
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            servers = ", ".join(
                f"{name} pid {int(r['pid'])}" for name, r in self._records().items()
            )
            raise DataDirBusy(
                f"another `tierpoint dev` (pid {owner}) is running on {self.paths.data_dir}"
                + (f" with {servers}" if servers else "")
                + f": stop it first (Ctrl-C in its terminal, or kill {owner})"
            ) from None
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        stopped = [
            f"{name} (pid {int(r['pid'])})"
            for name, r in self._records().items()
            if name != "postgres" and stop_process(int(r["pid"]), r.get("create_time"))
        ]
        # guard: dev-restart-adopts-left-postgres
        postmaster = postgres.stop_leftover()
        if postmaster is not None:
            stopped.append(f"postgres (pid {postmaster})")
        self._write({})
        return stopped

    def record(self, name: str, pid: int | None) -> None:
        """Note a server this stack started, before anything else can go wrong."""
        if pid is None:
            return
        records = self._records()
        records[name] = {"pid": pid, "create_time": create_time(pid) or 0.0}
        self._write(records)

    def _write(self, records: dict[str, dict[str, float]]) -> None:
        tmp = self.paths.data_dir / f".{CHILDREN_FILE}.tmp"
        tmp.write_text(json.dumps(records, indent=2) + "\n")
        tmp.replace(self.children_file)

    def release(self) -> None:
        """After every server stopped: nothing left to record, and the data dir is free. The pid
        file stays (emptied): removing a file others may be waiting to lock would let two
        processes lock two different files of one name."""
        if self._fd is None:
            return
        self.children_file.unlink(missing_ok=True)
        os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None
