"""What the DCP writer and reader share that needs no torch: where a rank's files go, what each
stored item records, and the atomic, checksummed file writes."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierpoint_client.errors import TierpointError
from tierpoint_client.hashing import combine, crc32c_hex, update
from tierpoint_client.models import TierInfo
from tierpoint_client.paths import NAME_BODY, partial_name

# This node's id, as its tierpoint node worker knows it (`tierpoint worker --node N`).
NODE_ENV = "TIERPOINT_NODE"
# DCP's global metadata file; registered as a shard of the checkpoint like every data file.
METADATA_FILE = ".metadata"
SCHEME = "tierpoint://"
# Writeback of a file being written starts every this many bytes, so the device works while the
# rest is serialised and the final fsync waits only for the tail.
WRITEBACK_BYTES = 8 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2
_ID = re.compile(rf"^tierpoint://(?P<job>{NAME_BODY})(?:/(?P<step>\d+))?/?$")


@dataclass(frozen=True)
class TierpointStorageInfo:
    """One stored item, as DCP keeps it in `Metadata.storage_data` (pickled into `.metadata`).

    `path` is relative to the checkpoint directory on every tier; `file_size` and `crc32c` are the
    whole file's, as registered, so a reader can verify any copy of it. `item_crc32c` is the crc32c
    of the item's own `length` bytes: a reader that fetches only some items of a file verifies
    each against it (None in checkpoints written before it existed: those are read whole).

    It is also DCP's own record of an item (its `_StorageInfo`: `relative_path`, `offset`,
    `length`, `transform_descriptors`), so that DCP's FileSystemReader, the reader of a load by
    `tierpoint://` URL, reads a checkpoint TierpointWriter wrote; and a save by URL records its
    items in this form too (see `stored_items`). One checkpoint, either reader.
    """

    path: str
    offset: int
    length: int
    node: str
    file_size: int
    crc32c: str
    item_crc32c: str | None = None
    # DCP's storage extensions the item's bytes went through (e.g. a compression), as DCP names
    # them; None for plain bytes. Records pickled before it existed read the class's None.
    transform_descriptors: tuple[str, ...] | None = None

    @property
    def relative_path(self) -> str:
        return self.path


def stored_items(
    storage_data: object, file_of: Callable[[str], tuple[str, int, str]], where: str
) -> dict[Any, TierpointStorageInfo]:
    """`.metadata`'s records of its items as TierpointStorageInfo, whichever writer made them:
    TierpointWriter's as they are; DCP's own (`relative_path`, `offset`, `length`: a save by
    URL before both writers recorded alike) completed with their file's (node, size, crc32c)
    from `file_of`. TierpointError naming `where` for anything else."""
    if not isinstance(storage_data, dict):
        raise TierpointError(f"{where}: {METADATA_FILE} is not DCP checkpoint metadata")
    out: dict[Any, TierpointStorageInfo] = {}
    for index, info in storage_data.items():
        if isinstance(info, TierpointStorageInfo):
            out[index] = info
            continue
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(name, str) and isinstance(offset, int) and isinstance(length, int)):
            raise TierpointError(
                f"{where}: {METADATA_FILE} records an item in a form tierpoint does not know "
                f"({type(info).__name__})"
            )
        node, size, crc = file_of(name)
        transforms = getattr(info, "transform_descriptors", None)
        out[index] = TierpointStorageInfo(
            name,
            offset,
            length,
            node,
            size,
            crc,
            transform_descriptors=tuple(transforms) if transforms else None,
        )
    return out


def parse_checkpoint_id(checkpoint_id: object) -> tuple[str, int | None] | None:
    """(job, step) of `tierpoint://<job>[/<step>]`, else None."""
    if not isinstance(checkpoint_id, str):
        return None
    m = _ID.match(checkpoint_id)
    if m is None:
        return None
    return m["job"], int(m["step"]) if m["step"] is not None else None


def resolve_node(node: str | None, *, required: bool) -> str | None:
    found = node or os.environ.get(NODE_ENV) or None
    if found is None and required:
        raise TierpointError(
            f"this node's id is unknown: pass node= or set {NODE_ENV} (the id its tierpoint "
            "node worker reports)"
        )
    return found


def local_tier(tiers: Sequence[TierInfo]) -> TierInfo | None:
    """The tier checkpoints are written to: the first local tier of the server's config."""
    return next((t for t in tiers if t.kind == "local" and t.root), None)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    # Linux only, and not in the os module. The server has its own (tierpoint.storage): the
    # client package depends on none of the server's.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing [offset, offset+length) to the device, without waiting.
    Advisory: where it is missing or refused, the commit's fsync writes everything."""
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a temporary name with its crc32c computed on the way; `commit`
    fsyncs it and renames it into place, so its final name only ever holds a complete file.
    Writeback starts every WRITEBACK_BYTES, so writing to the device overlaps the writes that
    follow instead of all waiting for the fsync."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.tmp = final.with_name(partial_name(final.name, uuid.uuid4().hex[:12]))
        self._f = open(self.tmp, "xb")  # noqa: SIM115 - closed by commit or abort
        self.size = 0
        self._crc = 0
        self._written_back = 0

    def write(self, data: bytes | bytearray | memoryview, crc: int | None = None) -> None:
        """Append `data`; `crc` is its own crc32c when the caller has it already (it is then
        folded into the file's instead of hashing the bytes again)."""
        n = memoryview(data).nbytes
        self._crc = update(self._crc, data) if crc is None else combine(self._crc, crc, n)
        self._f.write(data)
        self.size += n
        if self.size - self._written_back >= WRITEBACK_BYTES:
            self._f.flush()
            start_writeback(self._f.fileno(), self._written_back, self.size - self._written_back)
            self._written_back = self.size

    def fileno(self) -> int:
        """The temporary file's descriptor, every byte written so far handed to the kernel (so
        that an fsync of it covers them)."""
        self._f.flush()
        return self._f.fileno()

    def commit(self) -> tuple[int, str]:
        """(size, crc32c) of the committed file."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.tmp, self.final)
        fsync_dir(self.final.parent)
        return self.size, crc32c_hex(self._crc)

    def abort(self) -> None:
        self._f.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
