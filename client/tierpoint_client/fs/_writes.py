"""The files a save writes: staged on this node's local tier exactly as TierpointWriter writes
them (temporary name, crc32c while writing, fsync and rename), and the record of each file's
size, crc32c and node that the commit registers.

A rank's record must reach the coordinator, which may run on another node and registers every
rank's files at the commit. The record goes into torch.distributed's key-value store (the one the
ranks rendezvoused through) under the file's name; the coordinator reads it back at the commit,
which DCP runs only after every rank has closed its files. That costs the API nothing and needs
no collective (the other ranks wait in one of DCP's while the coordinator commits). A process
without torch.distributed keeps its records in memory only.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from tierpoint_client.errors import TierpointError
from tierpoint_client.torch._files import AtomicFile

_STORE_PREFIX = "tierpoint-fs"
# How long a rank waits for the coordinator to hand over the local tier's root before it asks the
# server itself (a cost, never a correctness matter: the root is the same either way).
ROOT_WAIT = timedelta(seconds=60)


@dataclass(frozen=True)
class FileRecord:
    size: int
    crc32c: str
    node: str


_lock = threading.Lock()
_records: dict[tuple[str, int, str], FileRecord] = {}


def _key(job: str, step: int, name: str) -> str:
    return f"{_STORE_PREFIX}/{job}/{step}/{name}"


def distributed() -> Any | None:
    """torch.distributed when this process is one rank of an initialised group, else None. Only
    if torch is imported already: the filesystem never imports torch itself."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def is_coordinator() -> bool:
    dist = distributed()
    return dist is None or dist.get_rank() == 0


def publish_root(job: str, step: int, root: str | None) -> None:
    """The coordinator hands the local tier's root to the other ranks of the save (None: it has
    none to hand; each rank asks the server itself)."""
    dist = distributed()
    if dist is not None:
        store = dist.distributed_c10d._get_default_store()
        store.set(_root_key(job, step), json.dumps(root))


def published_root(job: str, step: int) -> str | None:
    """The root the coordinator handed over for this save. Every rank of a DCP save opens its
    files, the coordinator among them, so it comes; a rank that saves on its own (no coordinator
    takes part) stops waiting after ROOT_WAIT and asks the server itself."""
    dist = distributed()
    if dist is None:
        return None
    store = dist.distributed_c10d._get_default_store()
    key = _root_key(job, step)
    try:
        store.wait([key], ROOT_WAIT)
    except RuntimeError:  # timed out (torch's DistStoreError is one)
        return None
    root = json.loads(store.get(key))
    return root if isinstance(root, str) else None


def _root_key(job: str, step: int) -> str:
    # Not under _key's prefix: no file name of the step can collide with it.
    return f"{_STORE_PREFIX}-root/{job}/{step}"


def record(job: str, step: int, name: str, rec: FileRecord) -> None:
    with _lock:
        _records[job, step, name] = rec
    dist = distributed()
    if dist is not None:
        store = dist.distributed_c10d._get_default_store()
        store.set(_key(job, step, name), json.dumps(asdict(rec)))


def forget(job: str, step: int, name: str) -> None:
    with _lock:
        _records.pop((job, step, name), None)


def lookup(job: str, step: int, name: str) -> FileRecord:
    """A file's record: this process's own, else the one its rank put in the store."""
    with _lock:
        mine = _records.get((job, step, name))
    if mine is not None:
        return mine
    dist = distributed()
    key = _key(job, step, name)
    if dist is not None:
        store = dist.distributed_c10d._get_default_store()
        # check() does not wait: every rank closed its files before DCP commits.
        if store.check([key]):
            return FileRecord(**json.loads(store.get(key)))
    raise TierpointError(
        f"{job}/step-{step}: {name!r} is named by the checkpoint's metadata but no rank of this "
        "job wrote it through tierpoint:// (nothing was registered)"
    )


def names(job: str, step: int) -> set[str]:
    """The files of a step this process wrote and put in place."""
    with _lock:
        return {k[2] for k in _records if k[:2] == (job, step)}


def forget_step(job: str, step: int) -> None:
    with _lock:
        for key in [k for k in _records if k[:2] == (job, step)]:
            del _records[key]


class StagedFile:
    """A file opened for writing: bytes go straight to a temporary file on the local tier,
    through crc32c. `flush` sends nothing anywhere; `fileno` is that file's real descriptor (DCP
    fsyncs it, and without one it would sync the whole machine). `close` (again: a no-op) puts the
    file in place and records it; in an fsspec transaction (`autocommit=False`) it only stages,
    and the transaction's `commit` or `discard` decides. Leaving with an exception, or being
    collected unclosed, discards: a failed write never takes the file's name."""

    def __init__(
        self, final: Path, on_commit: Any, *, autocommit: bool = True, owner: Any = None
    ) -> None:
        self._done = True  # until the temporary file exists, there is nothing to discard
        self._out = AtomicFile(final)
        self._on_commit = on_commit  # (size, crc32c) -> None
        self.owner = owner  # the save it belongs to, for the transaction that commits it
        self.autocommit = autocommit
        self.closed = False
        self._done = False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        self._out.write(data)
        return memoryview(data).nbytes

    def tell(self) -> int:
        return self._out.size

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        # What DCP fsyncs must hold every byte written so far.
        return self._out.fileno()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.autocommit:
            self.commit()

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        size, crc = self._out.commit()
        self._on_commit(size, crc)

    def discard(self) -> None:
        self.closed = True
        if not self._done:
            self._done = True
            self._out.abort()

    def __enter__(self) -> StagedFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:
        if not self._done:
            self.discard()
