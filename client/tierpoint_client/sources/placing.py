"""How a source's bytes reach a placement and are verified, whatever the source: the file cut
into pieces, each hashed as it lands; the pieces' crc32c combined in file order and checked
against the registered one; a stream placed front to back; and the process's reader threads,
which read pieces (or stripes of them) in parallel."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from tierpoint_client.hashing import chunk_buffer, combine, crc32c_hex, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.sources.base import Mismatch, Placement, Segment, Sink
from tierpoint_client.transport import read_full

# Each piece is hashed right after it lands, while it is still in the CPU's cache.
PIECE = 4 * 1024 * 1024
# Positional reads and socket reads release the GIL, so threads keep the device (or the page
# cache, or the network) busy.
READ_THREADS = 4

T = TypeVar("T")


def pieces(segments: Iterable[Segment], size: int) -> list[Segment]:
    """The segments cut into pieces of at most PIECE bytes, checked to tile [0, size)."""
    out: list[Segment] = []
    pos = 0
    for seg in segments:
        if seg.offset != pos or seg.length < 0:
            raise ValueError(f"placement: a segment at {seg.offset}, expected {pos}")
        for start in range(0, seg.length, PIECE):
            n = min(PIECE, seg.length - start)
            view = None if seg.view is None else seg.view[start : start + n]
            out.append(Segment(pos + start, n, view, seg.filled))
        pos += seg.length
    if pos != size:
        raise ValueError(f"placement: segments end at {pos}, the file at {size}")
    return out


def target(piece: Segment) -> memoryview:
    """Where a piece's bytes land: its view, or this thread's scratch buffer (bytes read,
    verified and dropped)."""
    return piece.view if piece.view is not None else chunk_buffer(PIECE)[: piece.length]


def check(entry: PlanEntry, pieces: Sequence[Segment], crcs: Sequence[int]) -> None:
    """The pieces' crc32c, combined in file order, against the registered one: bytes already in
    the reader's memory must verify, or the next copy replaces them."""
    crc = 0
    for piece, piece_crc in zip(pieces, crcs, strict=True):
        crc = combine(crc, piece_crc, piece.length)
    check_crc(entry, crc)


def check_crc(entry: PlanEntry, crc: int) -> None:
    # guard: placed-read-crc
    actual = crc32c_hex(crc)
    if entry.crc32c is not None and actual != entry.crc32c.lower():
        raise Mismatch(f"crc32c {actual}, registered {entry.crc32c}")


def stream_into(
    readinto: Callable[[memoryview], int],
    entry: PlanEntry,
    placement: Placement,
    copy: Sink | None,
) -> None:
    """Read a copy that is one stream (`readinto`: 0 at its end) front to back straight into
    the memory `placement` gives, each piece through crc32c as it lands (and on to `copy`);
    Mismatch unless the stream's size and crc32c equal the registered ones."""
    taken = 0  # bytes taken off the stream (a head read to decide is taken before it is placed)

    def fill(view: memoryview) -> int:
        nonlocal taken
        got = read_full(readinto, view)
        taken += got
        return got

    def pread(offset: int, length: int) -> memoryview:
        if offset != taken:
            raise ValueError(f"placement: a streamed read at {offset}, the stream at {taken}")
        view = memoryview(bytearray(length))
        return view[: fill(view)]

    crc = pos = 0
    for seg in placement.segments(pread):
        if seg.offset != pos:
            raise ValueError(f"placement: a segment at {seg.offset}, expected {pos}")
        for start in range(0, seg.length, PIECE):
            n = min(PIECE, seg.length - start)
            view = chunk_buffer(PIECE)[:n] if seg.view is None else seg.view[start : start + n]
            if not seg.filled and fill(view) < n:
                raise Mismatch(f"ends at {taken}: shorter than registered {entry.size}")
            piece_crc = update(0, view)
            crc = combine(crc, piece_crc, n)
            if copy is not None:
                copy.write(view, piece_crc)
        pos += seg.length
    if pos != entry.size:
        raise ValueError(f"placement: segments end at {pos}, the file at {entry.size}")
    if fill(memoryview(bytearray(1))):
        raise Mismatch(f"larger than the registered {entry.size} bytes")
    check_crc(entry, crc)


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _forget_pools() -> None:
    """In a forked child: none of the parent's threads exist there, and a pool whose threads sat
    idle at the fork counts them still, so it starts none and a task handed to it never runs. The
    child starts its own pools; a new lock, as a parent's thread may have held this one at the
    fork (and never releases it in the child)."""
    global _pools, _pools_lock
    _pools, _pools_lock = {}, threading.Lock()


# guard: fork-forgets-reader-pools
os.register_at_fork(after_in_child=_forget_pools)


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of reader threads: made once, not per file (starting threads costs
    more than reading a small file)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, "tierpoint-read")
        return pool


def in_parallel(
    read: Callable[[T], list[int]], parts: Sequence[T], threads: int = READ_THREADS
) -> list[int]:
    """`read(part)` of every part on the reader threads: the pieces' crc32c, in order. Each
    thread takes the next part until none is left: one task per thread, not a task and a future
    per part (a 1 GiB file of 16 MiB tensors and their biases is some 600 parts, and on a busy
    machine the submits and wake-ups cost the caller's thread more than the rest of its work).
    On a failure no thread takes another part, and every running one is waited for: none may
    write into the memory after this returns (the next copy is read into it) or use what the
    caller closes then."""
    results: list[list[int]] = [[] for _ in parts]
    taken = iter(range(len(parts)))
    lock = threading.Lock()
    failed = threading.Event()

    def work() -> None:
        while not failed.is_set():
            with lock:
                i = next(taken, None)
            if i is None:
                return
            try:
                results[i] = read(parts[i])
            except BaseException:
                failed.set()
                raise

    pool = _pool(threads)
    futures: list[Future[None]] = [pool.submit(work) for _ in range(min(threads, len(parts)))]
    try:
        wait(futures)
    except BaseException:  # interrupted here: the threads stop at their current part
        failed.set()
        wait(futures)
        raise
    for f in futures:
        f.result()  # the first failure, raised
    return [crc for part in results for crc in part]
