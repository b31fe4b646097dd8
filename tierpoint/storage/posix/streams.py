"""The two loops of a POSIX copy that overlap I/O with I/O.

`prefetched_chunks` reads a copy's source one chunk ahead on a helper thread, so the read of chunk
i+1 runs while chunk i is written and its writeback waited for. `device_crc32c` reads a file back
with O_DIRECT, two reads in flight: nothing passes through the page cache (no pages to fill and
drop again, and no cached page can answer instead of the device), and the device always has the
next request queued. Both rely on os.preadv / os.readv and crc32c releasing the GIL.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from tierpoint.storage.base import ByteSource
from tierpoint.storage.checksum import crc32c_update
from tierpoint.storage.source import read_full
from tierpoint.storage.throttle import TokenBucket

# Direct reads kept in flight: one being checksummed, one on the device.
DIRECT_DEPTH = 2
# What a file system answers when it cannot do O_DIRECT (tmpfs, some FUSE and network mounts).
_NO_DIRECT = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)

# Buffers are kept per thread and reused from one shard to the next: a fresh 8 MiB buffer is 2,048
# pages for the kernel to fault in and zero, which for an 8 MiB shard cost as much as its read.
# They are only as large as the largest shard the thread has needed them for (up to the chunk
# size): a worker copying small shards on 64 threads held 2 GiB of 8 MiB buffers it never filled.
_cache = threading.local()


def _direct_buffers(size: int) -> list[mmap.mmap]:
    """At least `size` bytes each (page-aligned mmaps): slice them to `size`."""
    bufs: list[mmap.mmap] | None = getattr(_cache, "direct", None)
    if bufs is None or len(bufs[0]) < size:
        bufs = [mmap.mmap(-1, size) for _ in range(DIRECT_DEPTH)]
        _cache.direct = bufs
    return bufs


def _copy_buffers(size: int) -> tuple[memoryview, memoryview]:
    """At least `size` bytes each: slice them to `size`."""
    bufs: tuple[memoryview, memoryview] | None = getattr(_cache, "copy", None)
    if bufs is None or len(bufs[0]) < size:
        bufs = (memoryview(bytearray(size)), memoryview(bytearray(size)))
        _cache.copy = bufs
    return bufs


def prefetched_chunks(source: ByteSource, total: int, buffer_size: int) -> Iterator[memoryview]:
    """Successive chunks of `source` up to `total` bytes, each `buffer_size` long but the last; a
    shorter one means the source ended early. A chunk is valid until the next is asked for.
    Below two chunks nothing is worth overlapping, and no thread is started."""
    if total <= 0:
        return
    size = min(buffer_size, total)
    bufs = _copy_buffers(size)
    if total <= size:
        yield bufs[0][: read_full(source, bufs[0][:size])]
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierpoint-read") as pool:
        left, i = total, 0
        pending: Future[int] | None = pool.submit(read_full, source, bufs[0][:size])
        while pending is not None:
            want = min(size, left)
            n = pending.result()
            left -= n
            pending = None
            if n == want and left > 0:
                pending = pool.submit(read_full, source, bufs[(i + 1) % 2][: min(size, left)])
            yield bufs[i % 2][:n]
            i += 1


def _enable_direct(fd: int) -> bool:
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError as e:
        if e.errno in _NO_DIRECT:
            return False
        raise
    return True


def _disable_direct(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)


def _direct_pass(
    fd: int,
    buffer_size: int,
    limiter: TokenBucket | None,
    progress: Callable[[int], None] | None,
) -> tuple[int, int]:
    # mmap'd buffers are page aligned, their size a multiple of the page and every offset a
    # multiple of the buffer size: what O_DIRECT asks of buffer, length and offset.
    end = os.fstat(fd).st_size  # what the reads are charged for; they still read to the real end
    # No larger than the file (in whole pages, one more so that the read that finds the end is
    # short): a small shard's read-back needs no 8 MiB buffers.
    fits = (end // mmap.PAGESIZE + 1) * mmap.PAGESIZE
    size = max(mmap.PAGESIZE, min(buffer_size // mmap.PAGESIZE * mmap.PAGESIZE, fits))
    views = [memoryview(b)[:size] for b in _direct_buffers(size)]
    crc = total = 0
    try:
        with ThreadPoolExecutor(DIRECT_DEPTH, thread_name_prefix="tierpoint-verify-io") as pool:

            def submit(k: int, offset: int) -> Future[int]:
                # Charged before it is issued: a read in flight is bandwidth taken already, and
                # the limit is on the device's reads, not on what the checksum has seen.
                if limiter is not None:
                    limiter.consume(max(0, min(size, end - offset)))
                return pool.submit(os.preadv, fd, [views[k]], offset)

            inflight = [submit(k, k * size) for k in range(DIRECT_DEPTH)]
            k = 0
            try:
                while True:
                    n = inflight[k].result()
                    crc = crc32c_update(crc, views[k][:n])
                    total += n
                    if progress is not None and n:
                        progress(total)
                    if n < size:
                        break
                    inflight[k] = submit(k, total + (DIRECT_DEPTH - 1) * size)
                    k = (k + 1) % DIRECT_DEPTH
            finally:
                for f in inflight:
                    f.cancel()
                # Reads past the end still in flight must finish before their buffers go.
                for f in inflight:
                    if not f.cancelled():
                        f.exception()
    finally:
        for v in views:
            v.release()
    return total, crc


def device_crc32c(
    fd: int,
    buffer_size: int,
    limiter: TokenBucket | None,
    progress: Callable[[int], None] | None,
    buffered: Callable[[], tuple[int, int]],
) -> tuple[int, int]:
    """(size, crc32c) of the whole file behind `fd` (read-only, at any position), read from the
    device with O_DIRECT; where the file system refuses O_DIRECT, `buffered()` does it instead
    (the caller's fsync + drop + buffered read)."""
    if not _enable_direct(fd):
        return buffered()
    try:
        return _direct_pass(fd, buffer_size, limiter, progress)
    except OSError as e:
        # Accepted at open but refused at the first read (alignment the device does not do).
        if e.errno not in _NO_DIRECT:
            raise
    _disable_direct(fd)
    os.lseek(fd, 0, os.SEEK_SET)
    return buffered()
