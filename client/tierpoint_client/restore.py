"""Copy a restore plan's shards into a local directory, verifying crc32c on the way.

Each shard is written to a temporary name in its final directory, fsynced, checked against the
registered size and crc32c, and only then renamed; on any error the temporary file is removed, so a
file under its final name is always a complete, verified copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

from tierpoint_client.errors import ChecksumMismatchError, TierpointError
from tierpoint_client.errors import SourceError as SourceError
from tierpoint_client.hashing import CHUNK_SIZE, crc32c_hex, update
from tierpoint_client.models import PlanEntry, RestoredFile, TierInfo
from tierpoint_client.paths import partial_name, safe_join, validate_relative_path
from tierpoint_client.sources import Sources

ProgressCallback = Callable[[int, int], None]
# Called when a shard's bytes did not match: (the entry read, the mismatch, tiers tried so far);
# returns another source of the same shard to try, or None to give up.
FallbackFn = Callable[[PlanEntry, ChecksumMismatchError, frozenset[str]], "PlanEntry | None"]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Progress:
    def __init__(self, total: int, callback: ProgressCallback | None) -> None:
        self.total = total
        self.done = 0
        self.callback = callback
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        if self.callback is None:
            return
        with self._lock:
            self.done += n
            self.callback(self.done, self.total)


def restore_shard(
    entry: PlanEntry,
    dest_dir: Path,
    sources: Sources,
    progress: _Progress,
    chunk_size: int = CHUNK_SIZE,
    *,
    sync_dir: bool = True,
) -> RestoredFile:
    final = safe_join(dest_dir, validate_relative_path(entry.path))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(partial_name(final.name, uuid.uuid4().hex[:12]))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    crc = 0
    size = 0
    counted = 0
    try:
        # The chunks are closed on an error too: a stream left early goes with its connection.
        with (
            os.fdopen(fd, "wb", buffering=0) as out,
            contextlib.closing(sources.chunks(entry, chunk_size)) as chunks,
        ):
            for chunk in chunks:
                crc = update(crc, chunk)
                view = memoryview(chunk)
                while view:
                    written = out.write(view)
                    assert written is not None  # raw files in blocking mode
                    view = view[written:]
                size += len(chunk)
                if size > entry.size:
                    # Do not copy the rest of an oversized source only to reject it.
                    raise ChecksumMismatchError(
                        entry.path, entry.location, entry.size, size, entry.crc32c, "(partial)"
                    )
                progress.add(len(chunk))
                counted += len(chunk)
            os.fsync(out.fileno())
        actual = crc32c_hex(crc)
        if size != entry.size or (entry.crc32c is not None and actual != entry.crc32c.lower()):
            raise ChecksumMismatchError(
                entry.path, entry.location, entry.size, size, entry.crc32c, actual
            )
        os.replace(tmp, final)
    except BaseException:
        # Leave nothing that could be taken for a restored shard.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # These bytes are not restored: a read from another copy counts them again.
        progress.add(-counted)
        raise
    if sync_dir:
        _fsync_dir(final.parent)
    return RestoredFile(entry.path, size, actual, entry.tier, entry.location)


def restore_plan(
    plan: Sequence[PlanEntry],
    dest_dir: str | os.PathLike[str],
    tiers: dict[str, TierInfo],
    *,
    workers: int = 4,
    progress: ProgressCallback | None = None,
    fallback: FallbackFn | None = None,
    token: str | None = None,
) -> tuple[list[RestoredFile], float]:
    """Restore every entry; returns the restored files (plan order) and the seconds it took.

    A shard whose bytes do not match is offered to `fallback`, which may name another source of
    the same shard (and report the bad one); without one, or when it has none, the mismatch is
    raised."""
    started = time.monotonic()
    # Refuse a bad plan before writing anything.
    for entry in plan:
        validate_relative_path(entry.path)
    if len({e.path for e in plan}) != len(plan):
        raise TierpointError("the restore plan names a shard twice")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in plan:
        safe_join(dest, entry.path)
    sources = Sources(tiers, plan, token)
    tracker = _Progress(sum(e.size for e in plan), progress)

    def one(entry: PlanEntry) -> RestoredFile:
        tried: set[str] = set()
        while True:
            try:
                return restore_shard(entry, dest, sources, tracker, sync_dir=False)
            except ChecksumMismatchError as err:
                tried.add(entry.tier)
                other = fallback(entry, err, frozenset(tried)) if fallback is not None else None
                if other is None or other.tier in tried or other.path != entry.path:
                    raise
                entry = other

    files = _run(plan, one, workers)
    # Each file was fsynced before its rename; the renames are made durable once per directory
    # (a directory fsync can cost a journal commit: one per shard is one per file restored).
    for directory in sorted({safe_join(dest, f.path).parent for f in files}):
        _fsync_dir(directory)
    return files, time.monotonic() - started


def _run(
    plan: Sequence[PlanEntry], one: Callable[[PlanEntry], RestoredFile], workers: int
) -> list[RestoredFile]:
    if workers <= 1 or len(plan) <= 1:
        return [one(e) for e in plan]
    with ThreadPoolExecutor(max_workers=min(workers, len(plan))) as pool:
        futures: list[Future[RestoredFile]] = [pool.submit(one, e) for e in plan]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for f in futures:
                f.cancel()
            err = failed[0].exception()
            assert err is not None
            raise err
        return [f.result() for f in futures]
