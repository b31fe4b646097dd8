"""Copy a restore plan's shards into a local directory, verifying crc32c on the way.

Each shard is written to a temporary name in its final directory, fsynced, checked against the
registered size and crc32c, and only then renamed; on any error the temporary file is removed, so a
file under its final name is always a complete, verified copy.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierpoint_client import peer, s3
from tierpoint_client.errors import ChecksumMismatchError, TierpointError
from tierpoint_client.errors import SourceError as SourceError
from tierpoint_client.hashing import CHUNK_SIZE, chunk_buffer, crc32c_hex, update
from tierpoint_client.models import PlanEntry, RestoredFile, TierInfo
from tierpoint_client.paths import PARTIAL_SUFFIX, safe_join, validate_relative_path
from tierpoint_client.transport import read_full

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ProgressCallback = Callable[[int, int], None]
# Called when a shard's bytes did not match: (the entry read, the mismatch, tiers tried so far);
# returns another source of the same shard to try, or None to give up.
FallbackFn = Callable[[PlanEntry, ChecksumMismatchError, frozenset[str]], "PlanEntry | None"]


def _posix_chunks(location: str, chunk_size: int) -> Generator[memoryview, None, None]:
    buf = bytearray(chunk_size)
    view = memoryview(buf)
    try:
        f = open(location, "rb", buffering=0)  # noqa: SIM115 - closed in finally of a generator
    except FileNotFoundError:
        raise SourceError(f"restore source {location} does not exist") from None
    try:
        while True:
            n = f.readinto(view)
            if not n:
                return
            yield view[:n]
    finally:
        f.close()


class Sources:
    """Opens plan entries for reading; one boto3 client per S3 tier, made up front. A peer copy
    is read from its holder's data endpoint with `token` (the API token: the endpoint accepts a
    token whose scopes cover the job)."""

    def __init__(
        self, tiers: dict[str, TierInfo], entries: Sequence[PlanEntry], token: str | None = None
    ) -> None:
        self._s3: dict[str, S3Client] = {}
        self._token = token
        self._tiers = tiers
        self._lock = threading.Lock()
        for tier in sorted({e.tier for e in entries if e.kind == "s3"}):
            self._client(tier)

    def _client(self, tier: str) -> S3Client:
        """The tier's boto3 client, made on first use (a fallback source may name a new tier)."""
        with self._lock:
            client = self._s3.get(tier)
            if client is None:
                info = self._tiers.get(tier)
                if info is None:
                    raise SourceError(
                        f"the restore plan names tier {tier!r}, which GET /v1/tiers lacks"
                    )
                client = self._s3[tier] = s3.client_for(info)
            return client

    def chunks(self, entry: PlanEntry, chunk_size: int) -> Generator[memoryview, None, None]:
        if entry.kind in ("local", "shared"):
            return _posix_chunks(entry.location, chunk_size)
        if entry.kind in ("s3", "peer"):
            return self._streamed_chunks(entry, chunk_size)
        raise SourceError(
            f"tier {entry.tier!r} has kind {entry.kind!r}, which this client cannot read"
        )

    @contextlib.contextmanager
    def stream(self, entry: PlanEntry) -> Iterator[Callable[[memoryview], int]]:
        """An S3 or peer copy's bytes as one `readinto` (0 at the end), straight from the
        socket into the caller's memory; a failure to read, a body cut off among them, is
        SourceError. An S3 body read to its end goes back to botocore's pool; one left early
        (a longer copy, an error) is closed with its connection."""
        if entry.kind == "peer":
            with peer.stream(entry, self._token) as readinto:
                yield readinto
            return
        if entry.kind != "s3":
            raise SourceError(f"streamed reads are for S3 and peer tiers, not {entry.kind!r}")
        body = self._get(entry)["Body"]
        try:
            yield s3.readinto_of(body)
        except BaseException as e:
            body.close()
            if isinstance(e, (http.client.HTTPException, ConnectionError, TimeoutError)):
                raise SourceError(f"{entry.location} cut off: {e!r}") from None
            raise
        # guard: restore-s3-connection-kept
        s3.release(body)

    def read_range(self, entry: PlanEntry, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of an S3 entry's object, in one ranged GET (fewer when the
        object is shorter than the range)."""
        if entry.kind != "s3":
            raise SourceError(f"ranged reads are for S3 tiers; {entry.tier!r} is {entry.kind!r}")
        if length <= 0:
            return b""
        resp = self._get(entry, f"bytes={offset}-{offset + length - 1}")
        body = resp["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def _get(self, entry: PlanEntry, byte_range: str | None = None) -> Any:
        # The object as the API names it, never taken from `location`: that string is for people,
        # and a key may hold '?', '#' or '%' that a URL parser would cut or decode.
        bucket, key = entry.bucket, entry.key
        if not bucket or not key:
            raise SourceError(
                f"the restore plan gives no bucket and key for {entry.path!r} on tier "
                f"{entry.tier!r} (a server older than this client?)"
            )
        info = self._tiers[entry.tier]
        # Read only inside the tier's own bucket and prefix, whatever the plan says.
        if bucket != info.bucket or not key.startswith(info.prefix):
            raise SourceError(
                f"{entry.location} is outside tier {entry.tier!r} "
                f"(s3://{info.bucket}/{info.prefix})"
            )
        client = self._client(entry.tier)
        try:
            if byte_range is None:
                return client.get_object(Bucket=bucket, Key=key)
            return client.get_object(Bucket=bucket, Key=key, Range=byte_range)
        except client.exceptions.NoSuchKey:
            raise SourceError(f"restore source {entry.location} does not exist") from None
        except client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                raise SourceError(f"{entry.location} is shorter than the range read") from None
            raise

    def _streamed_chunks(
        self, entry: PlanEntry, chunk_size: int
    ) -> Generator[memoryview, None, None]:
        # One buffer per thread, filled in place from the socket: a `read(n)` (urllib3's
        # `readinto` too) would allocate and fault in a new chunk, then copy it.
        view = chunk_buffer(chunk_size)
        with self.stream(entry) as readinto:
            while n := read_full(readinto, view):
                yield view[:n]


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
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}")
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
        # guard: restore-progress-once
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
