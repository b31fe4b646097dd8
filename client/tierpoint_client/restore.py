"""Copy a restore plan's shards into a local directory, verifying crc32c on the way.

Each shard is written to a temporary name in its final directory, fsynced, checked against the
registered size and crc32c, and only then renamed; on any error the temporary file is removed, so a
file under its final name is always a complete, verified copy. A copy that cannot be read, or
whose bytes do not match, gives way to the next verified copy of the shard the fallback names.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

from tierpoint_client.errors import ChecksumMismatchError, NoVerifiedCopyError, TierpointError
from tierpoint_client.errors import SourceError as SourceError
from tierpoint_client.hashing import CHUNK_SIZE, crc32c_hex, update
from tierpoint_client.models import PlanEntry, RestoredFile, TierInfo
from tierpoint_client.paths import partial_name, safe_join, validate_relative_path
from tierpoint_client.sources import Sources

ProgressCallback = Callable[[int, int], None]
# Why a copy was given up: it could not be read, or its bytes did not match.
CopyFailure = SourceError | ChecksumMismatchError
# Called when a copy of a shard failed: (the entry read, why, tiers tried so far); returns another
# verified copy of the same shard to read, or None when there is none.
FallbackFn = Callable[[PlanEntry, CopyFailure, frozenset[str]], "PlanEntry | None"]


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


def _copy_chunks(
    sources: Sources, entry: PlanEntry, chunk_size: int
) -> Generator[memoryview, None, None]:
    """The copy's bytes. Any failure to read them, whatever raised it (an S3 client, a socket,
    a file system), is SourceError: this copy cannot be read, the next one may be."""
    chunks: Generator[memoryview, None, None] | None = None
    try:
        chunks = sources.chunks(entry, chunk_size)
        while (chunk := next(chunks, None)) is not None:
            yield chunk
    except SourceError:
        raise
    except Exception as e:
        raise SourceError(f"{entry.location} cannot be read: {e!r}") from e
    finally:
        # A stream left early goes with its connection.
        if chunks is not None:
            chunks.close()


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
        with os.fdopen(fd, "wb", buffering=0) as out:
            for chunk in _copy_chunks(sources, entry, chunk_size):
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
    job: str | None = None,
    step: int | None = None,
) -> tuple[list[RestoredFile], float]:
    """Restore every entry; returns the restored files (plan order) and the seconds it took.

    A copy that cannot be read or does not match is offered to `fallback`, which may name
    another verified copy of the same shard (and report a bad one); when no copy of a shard is
    left, NoVerifiedCopyError says what each copy tried gave (`job` and `step` name the
    checkpoint in it)."""
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
        tried: list[str] = []
        tiers_tried: set[str] = set()
        source: PlanEntry | None = entry
        last: CopyFailure | None = None
        while source is not None:
            try:
                return restore_shard(source, dest, sources, tracker, sync_dir=False)
            except (SourceError, ChecksumMismatchError) as err:
                last = err
                tried.append(_why(source, err))
                tiers_tried.add(source.tier)
                other = None if fallback is None else fallback(source, err, frozenset(tiers_tried))
                # Another copy of this shard, on a tier not read yet, or none.
                if other is not None and (other.tier in tiers_tried or other.path != entry.path):
                    other = None
                source = other
        raise NoVerifiedCopyError(job, step, entry.path, tried) from last

    files = _run(plan, one, workers)
    # Each file was fsynced before its rename; the renames are made durable once per directory
    # (a directory fsync can cost a journal commit: one per shard is one per file restored).
    for directory in sorted({safe_join(dest, f.path).parent for f in files}):
        _fsync_dir(directory)
    return files, time.monotonic() - started


def _why(source: PlanEntry, err: CopyFailure) -> str:
    """One copy tried, and why it was given up, for NoVerifiedCopyError."""
    if isinstance(err, ChecksumMismatchError):
        return (
            f"{source.tier} copy {source.location} failed verification ({err.actual_size} bytes, "
            f"crc32c {err.actual_crc32c}; registered {err.expected_size} bytes, crc32c "
            f"{err.expected_crc32c})"
        )
    return f"{source.tier} copy could not be read: {err}"


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
