"""Restore a plan's shards into a local directory, verifying crc32c on the way.

Each shard is read from its plan entry (and, when that copy cannot be read or does not match,
from the next verified copy the fallback names) into a staging directory inside the destination,
fsynced and checked against the registered size and crc32c. Only once every shard is verified
are they moved to their names (`destination`); a restore that fails or is interrupted removes
what it staged and leaves the destination as it was.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from tierpoint_client._fallback import Fallback
from tierpoint_client.api import Api
from tierpoint_client.destination import (
    Destination,
    Existing,
    check_destination,
    held_interrupts,
    shown,
)
from tierpoint_client.errors import (
    ChecksumMismatchError,
    NoVerifiedCopyError,
    RestoreInterrupted,
    TierpointError,
)
from tierpoint_client.errors import SourceError as SourceError
from tierpoint_client.hashing import CHUNK_SIZE, crc32c_hex, update
from tierpoint_client.leases import held, owner
from tierpoint_client.models import (
    LatestCheckpoint,
    PlanEntry,
    RestoredFile,
    RestoreResult,
    TierInfo,
)
from tierpoint_client.paths import PARTIAL_SUFFIX, check_no_path_conflict, validate_relative_path
from tierpoint_client.sources import Sources
from tierpoint_client.sources.coded import StripeReport, restore_coded

ProgressCallback = Callable[[int, int], None]
# Why a copy was given up: it could not be read, or its bytes did not match.
CopyFailure = SourceError | ChecksumMismatchError
# Called when a copy of a shard failed: (the entry read, why, tiers tried so far); returns another
# verified copy of the same shard to read, or None when there is none.
FallbackFn = Callable[[PlanEntry, CopyFailure, frozenset[str]], "PlanEntry | None"]


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


class _Stopped(Exception):
    """The restore is being given up (a shard failed, or Ctrl-C): the other shards stop."""


def _copy_chunks(
    sources: Sources, entry: PlanEntry, chunk_size: int
) -> Generator[memoryview, None, None]:
    """The copy's bytes. Any failure to read them, whatever raised it (an S3 client, a socket,
    a file system), is SourceError: this copy cannot be read, the next one may be."""
    chunks: Generator[memoryview, None, None] | None = None
    try:
        chunks = sources.open(entry).chunks(chunk_size)
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


def stage_shard(
    entry: PlanEntry,
    tmp: Path,
    sources: Sources,
    progress: _Progress,
    stop: threading.Event,
    report_stripe: StripeReport | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> RestoredFile:
    """Copy one copy of a shard to `tmp`, fsynced and verified against the registered size and
    crc32c. On any failure `tmp` is removed: SourceError when the copy could not be read,
    ChecksumMismatchError when its bytes do not match; anything else is the destination's. A
    coded copy's stripes that did not match are given to `report_stripe`."""
    # A coded copy: decoded from its stripes, written and checked by the decode.
    # guard: coded-copy-read-by-stripes
    if entry.code is not None:
        restore_coded(entry, tmp, sources.token, report_stripe)
        progress.add(entry.size)
        return RestoredFile(entry.path, entry.size, entry.crc32c or "", entry.tier, entry.location)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    crc = 0
    size = 0
    counted = 0
    try:
        with os.fdopen(fd, "wb", buffering=0) as out:
            for chunk in _copy_chunks(sources, entry, chunk_size):
                if stop.is_set():
                    raise _Stopped
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
            if stop.is_set():
                raise _Stopped  # a read cut short by the stop is not a mismatch to report
            os.fsync(out.fileno())
        actual = crc32c_hex(crc)
        if size != entry.size or (entry.crc32c is not None and actual != entry.crc32c.lower()):
            raise ChecksumMismatchError(
                entry.path, entry.location, entry.size, size, entry.crc32c, actual
            )
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # These bytes are not restored: a read from another copy counts them again.
        # guard: restore-progress-once
        progress.add(-counted)
        raise
    return RestoredFile(entry.path, size, actual, entry.tier, entry.location)


@dataclass(frozen=True)
class PlanRestored:
    """What `restore_plan` did: the files (plan order), the seconds it took, and the entries of
    the destination outside the checkpoint that it removed ("clean") or left beside it
    ("overwrite")."""

    files: list[RestoredFile]
    seconds: float
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


_Staged = tuple[Path, RestoredFile]


def restore_plan(
    plan: Sequence[PlanEntry],
    dest_dir: str | os.PathLike[str],
    tiers: dict[str, TierInfo],
    *,
    workers: int = 4,
    progress: ProgressCallback | None = None,
    fallback: FallbackFn | None = None,
    token: str | None = None,
    existing: Existing = "refuse",
    job: str | None = None,
    step: int | None = None,
    report_stripe: StripeReport | None = None,
) -> PlanRestored:
    """Restore every entry into `dest_dir`, all or nothing.

    A copy that cannot be read or does not match is offered to `fallback`, which may name
    another verified copy of the same shard (and report a bad one; a coded copy's stripe that
    did not match is given to `report_stripe`); when no copy of a shard is
    left, NoVerifiedCopyError says what each copy tried gave. `existing` says what to do with a
    destination that holds entries already: "refuse" (DestinationNotEmptyError), "overwrite"
    (the checkpoint's files replace theirs, the others stay) or "clean" (the others are removed
    once the checkpoint is verified). On any failure, and on Ctrl-C (RestoreInterrupted), what
    was staged is removed and the destination is as it was; `job` and `step` name the
    checkpoint in errors."""
    started = time.monotonic()
    # Refuse a bad plan, or a destination that cannot take it, before writing anything.
    for entry in plan:
        validate_relative_path(entry.path)
    paths = [e.path for e in plan]
    if len(set(paths)) != len(plan):
        raise TierpointError("the restore plan names a shard twice")
    check_no_path_conflict(paths)
    dest = Destination.survey(dest_dir, paths, existing)
    sources = Sources(tiers, token)
    tracker = _Progress(sum(e.size for e in plan), progress)
    staging = dest.begin()
    stop = threading.Event()
    verified: list[str] = []

    def one(index: int, entry: PlanEntry) -> _Staged:
        tried: list[str] = []
        tiers_tried: set[str] = set()
        source: PlanEntry | None = entry
        last: CopyFailure | None = None
        while source is not None:
            if stop.is_set():
                raise _Stopped
            tmp = staging / f"{index}.{len(tried)}{PARTIAL_SUFFIX}"
            try:
                restored = stage_shard(source, tmp, sources, tracker, stop, report_stripe)
            # guard: restore-falls-back-on-read-error
            except (SourceError, ChecksumMismatchError) as err:
                last = err
                tried.append(_why(source, err))
                tiers_tried.add(source.tier)
                other = None if fallback is None else fallback(source, err, frozenset(tiers_tried))
                # Another copy of this shard, on a tier not read yet, or none.
                if other is not None and (other.tier in tiers_tried or other.path != entry.path):
                    other = None
                source = other
                continue
            verified.append(entry.path)
            return tmp, restored
        raise NoVerifiedCopyError(job, step, entry.path, tried) from last

    try:
        staged = _run(plan, one, workers, stop)
    except KeyboardInterrupt:
        left = dest.abort()
        raise RestoreInterrupted(
            f"restore interrupted: {left} ({len(verified)} of {len(plan)} shards had been "
            "copied and verified, and were removed)"
        ) from None
    except BaseException as e:
        _note(e, dest.abort())
        raise
    interrupted = dest.commit([(e.path, tmp) for e, (tmp, _) in zip(plan, staged, strict=True)])
    if interrupted:
        raise RestoreInterrupted(
            f"restore interrupted as it finished: {shown(dest.path)} holds the whole checkpoint, "
            "verified"
        )
    return PlanRestored(
        [f for _, f in staged],
        time.monotonic() - started,
        removed=tuple(sorted((*dest.in_the_way, *dest.others))) if existing == "clean" else (),
        kept=dest.others if existing == "overwrite" else (),
    )


def _why(source: PlanEntry, err: CopyFailure) -> str:
    """One copy tried, and why it was given up, for NoVerifiedCopyError."""
    if isinstance(err, ChecksumMismatchError):
        return (
            f"{source.tier} copy {source.location} failed verification ({err.actual_size} bytes, "
            f"crc32c {err.actual_crc32c}; registered {err.expected_size} bytes, crc32c "
            f"{err.expected_crc32c})"
        )
    return f"{source.tier} copy could not be read: {err}"


def restore_latest(
    api: Api,
    latest: LatestCheckpoint,
    dest_dir: str | os.PathLike[str],
    *,
    workers: int,
    progress: ProgressCallback | None,
    node: str | None,
    tier: str | None,
    existing: Existing,
    lease_ttl: int,
) -> RestoreResult:
    """`Client.restore_checkpoint`: the plan restored under one lease, held from before the
    first read until the last file is in place (or the restore gave up)."""
    lease = latest.lease
    if lease is None or not lease.active:
        check_destination(dest_dir, existing)  # before a lease is taken for nothing
        lease = api.create_lease(latest.job, latest.step, lease_ttl, owner())
    with held(api, lease, lease_ttl):
        tiers = {t.name: t for t in api.tiers()}
        fallback = Fallback(api, latest, tiers, node, only_tier=tier)
        done = restore_plan(
            latest.plan,
            dest_dir,
            tiers,
            workers=workers,
            progress=progress,
            fallback=fallback,
            report_stripe=fallback.report_stripe,
            token=api.token,
            existing=existing,
            job=latest.job,
            step=latest.step,
        )
    return RestoreResult(
        job=latest.job,
        step=latest.step,
        dest_dir=os.fspath(Path(dest_dir)),
        files=tuple(done.files),
        bytes_total=sum(f.size for f in done.files),
        seconds=done.seconds,
        checkpoint=latest.checkpoint,
        skipped=latest.skipped,
        removed=done.removed,
        kept=done.kept,
    )


def _note(e: BaseException, text: str) -> None:
    """Tell whoever sees `e` what the destination holds now (PEP 678 notes, which tracebacks
    print; set by hand before Python 3.11, as the exceptiongroup backport does)."""
    add = getattr(e, "add_note", None)
    if add is not None:
        add(text)
    else:
        setattr(e, "__notes__", [*getattr(e, "__notes__", ()), text])  # noqa: B010


def _run(
    plan: Sequence[PlanEntry],
    one: Callable[[int, PlanEntry], _Staged],
    workers: int,
    stop: threading.Event,
) -> list[_Staged]:
    if workers <= 1 or len(plan) <= 1:
        return [one(i, e) for i, e in enumerate(plan)]
    pool = ThreadPoolExecutor(max_workers=min(workers, len(plan)))
    futures: list[Future[_Staged]] = []
    try:
        futures = [pool.submit(one, i, e) for i, e in enumerate(plan)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            err = f.exception() if f.done() else None
            if err is not None:
                raise err
        return [f.result() for f in futures]
    finally:
        # On a failure or Ctrl-C the shards still copying stop at their next chunk, the ones not
        # started never start; the staging directory is removed only once they all have stopped.
        stop.set()
        for f in futures:
            f.cancel()
        with held_interrupts():
            pool.shutdown(wait=True)
