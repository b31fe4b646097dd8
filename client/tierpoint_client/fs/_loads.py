"""Reading a committed step's files: from the fastest verified copy, verified before a byte is
handed out, falling back to the next copy exactly as TierpointReader does (its CheckpointFiles).

The first file the coordinator (rank 0; a process without torch.distributed is its own) opens of a
step starts a restore of that step: one request that takes a restore lease on it (so retention
deletes none of its copies while the ranks read) and lists every copy of every file, handed to
the other ranks through torch.distributed's store (_shared): a load costs the API the same at any
world size. Each process keeps the plan for the step's other files; the coordinator releases the
lease when its process exits (or it lapses after `lease_ttl`). A file is read whole and verified
when it is opened; its reads (DCP seeks all over it) are then served from memory.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import socket
import threading
import warnings
from dataclasses import dataclass

from tierpoint_client.client import Client
from tierpoint_client.errors import ConflictError, TierpointError
from tierpoint_client.fs import _shared
from tierpoint_client.fs._config import Settings, client_for
from tierpoint_client.models import PlanEntry, RestoreStart
from tierpoint_client.sources import Pread, Segment
from tierpoint_client.torch._copies import CheckpointFiles


@dataclass
class _Load:
    client: Client
    job: str
    step: int
    lease_id: int | None  # None: the coordinator's, released by the coordinator
    files: CheckpointFiles


_lock = threading.Lock()
_loads: dict[tuple[Settings, str, int], _Load] = {}


def open_file(settings: Settings, job: str, step: int, name: str) -> io.BytesIO:
    """One file of a restorable step, opened for reading: read whole and verified, then served
    from memory; FileNotFoundError when the step is not restorable or has no such file."""
    load = _load(settings, job, step)
    size = load.files.sizes.get(name)
    if size is None:
        raise FileNotFoundError(f"tierpoint://{job}/step-{step}/{name}")
    into = _InMemory(size)
    try:
        load.files.read(name, into)
    finally:
        into.release()
    return into.file


class _InMemory:
    """A placement of the whole file straight into the buffer of the in-memory file that serves
    its reads: the read that verifies the file is the only pass that moves its bytes (before,
    they went into a buffer of their own, then were copied into the file DCP reads)."""

    def __init__(self, size: int) -> None:
        self.file = io.BytesIO()
        if size:
            self.file.seek(size - 1)
            self.file.write(b"\0")
            self.file.seek(0)
        self._view: memoryview | None = None

    def segments(self, pread: Pread) -> list[Segment]:
        self.release()  # a copy that failed: the next one is read over it
        self._view = self.file.getbuffer()
        return [Segment(0, len(self._view), self._view)]

    def release(self) -> None:
        # The file cannot be closed while its buffer is exported.
        if self._view is not None:
            self._view.release()
            self._view = None


def _load(settings: Settings, job: str, step: int) -> _Load:
    key = (settings, job, step)
    with _lock:
        found = _loads.get(key)
    if found is not None:
        return found
    client = client_for(settings)
    owner = f"fsspec load, coordinator {socket.gethostname()} pid {os.getpid()}"

    def ask() -> RestoreStart | None:
        try:
            return client.start_restore(job, settings.lease_ttl, step=step, owner=owner)
        except ConflictError as e:  # not leasable: restorable from no tier
            raise FileNotFoundError(f"tierpoint://{job}/step-{step} is not restorable: {e}") from e

    # Every rank of a DCP load opens the step's files: the coordinator starts the restore and
    # the other ranks read by its plan, under its lease (_shared).
    start, mine = _shared.once(f"restore/{job}/{step}", ask)
    if start is None:
        raise FileNotFoundError(f"tierpoint://{job}/step-{step} is not restorable")

    def report(entry: PlanEntry, reason: str) -> None:
        try:
            client.report_corrupt_copy(
                job, step, entry.tier, entry.path, reason, branch=start.checkpoint.branch
            )
        except TierpointError as e:
            warnings.warn(
                f"tierpoint: could not report the corrupt copy of {job}/{step} {entry.path} "
                f"on tier {entry.tier} to the server: {e}",
                stacklevel=2,
            )

    files = CheckpointFiles(
        start.checkpoint,
        start.tiers,
        node=settings.node,
        tier=None,
        report=report,
        token=settings.token,
    )
    load = _Load(client, job, step, start.lease.id if mine else None, files)
    with _lock:
        kept = _loads.setdefault(key, load)
    if kept is not load:  # another thread started the same step meanwhile
        _release(load)
    return kept


def _release(load: _Load) -> None:
    if load.lease_id is None:
        return
    with contextlib.suppress(TierpointError):
        load.client.release_lease(load.job, load.step, load.lease_id)


def release_all() -> None:
    """Release every lease this process holds (at exit)."""
    with _lock:
        loads = list(_loads.values())
        _loads.clear()
    for load in loads:
        _release(load)


atexit.register(release_all)
