"""The ways the DCP reader reads one copy of a file, each verifying every byte it returns:

- placed (POSIX): the caller says where each byte of the file goes (a target tensor's memory, a
  buffer, or nowhere), reading a few bytes first to decide (`Placement`); the file is read once,
  in pieces by several threads straight into that memory, each piece through crc32c as it lands,
  and the pieces' checksums combined must match the file's registered size and crc32c;
- striped (a large peer copy, _striped): placed as a POSIX copy is, each stripe of pieces one
  ranged GET;
- whole: the file is streamed once through crc32c and must match its registered size and crc32c;
  only the byte ranges the caller needs are kept;
- ranged (S3): only the needed byte ranges are fetched, adjacent ones coalesced into one GET and
  the GETs run in parallel; each item is checked against its own crc32c, which the writer stored
  in `.metadata` (a file that is itself read whole and verified against its registered crc32c).

Placed and whole reads can also write every byte to a new local copy that is committed only when
the whole file matched (placed reads are then made in order, on one thread).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import CHUNK_SIZE, chunk_buffer, combine, crc32c_hex, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.sources import Sources
from tierpoint_client.torch._files import AtomicFile
from tierpoint_client.transport import read_full

Range = tuple[int, int]  # (offset, length) inside a file

# Ranges closer than this are fetched in one GET: a request costs more than a MiB of transfer.
COALESCE_GAP = 1024 * 1024
RANGED_GETS_IN_FLIGHT = 4
# Placed reads: each piece is hashed right after it lands, while it is still in the CPU's cache;
# positional reads release the GIL, so threads keep the device (or the page cache) busy.
PIECE = 4 * 1024 * 1024
READ_THREADS = 4


class Mismatch(Exception):
    """The bytes of a copy differ from what was registered for them."""


@dataclass(frozen=True)
class Segment:
    """Bytes [offset, offset + length) of a file and where they go: `view` (that many bytes), or
    nowhere (None: read and verified, then dropped). `filled`: the view holds them already (the
    bytes the placement read to decide), so they are hashed, not read again."""

    offset: int
    length: int
    view: memoryview | None = None
    filled: bool = False


Pread = Callable[[int, int], memoryview]  # (offset, length) -> the bytes there (fewer at the end)


class Placement(Protocol):
    def segments(self, pread: Pread) -> Iterable[Segment]:
        """Where every byte of the file goes, in order and without gaps, for one read of one
        copy (called again for the next copy after a failed one). Reads through `pread` go
        front to back, each only once the segments before it were taken (a stream has no
        other order)."""
        ...


def coalesce(wanted: Sequence[Range], gap: int = COALESCE_GAP) -> list[tuple[int, int]]:
    """(start, end) spans covering the sorted ranges, joining those at most `gap` bytes apart."""
    spans: list[tuple[int, int]] = []
    for off, length in sorted(wanted):
        if spans and off - spans[-1][1] <= gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], off + length))
        else:
            spans.append((off, off + length))
    return spans


def read_whole(
    sources: Sources, entry: PlanEntry, wanted: list[Range], copy: AtomicFile | None
) -> tuple[dict[Range, bytearray], bool]:
    """The `wanted` ranges of the file, which is read whole and verified, and whether `copy` (if
    given) was committed: it receives every byte and is committed only when the file verified,
    else removed."""
    bufs = [bytearray(length) for _, length in wanted]
    first = 0  # ranges before this one are complete
    pos = 0
    crc = 0
    try:
        with contextlib.closing(sources.chunks(entry, CHUNK_SIZE)) as chunks:
            for chunk in chunks:
                n = len(chunk)
                crc = update(crc, chunk)
                end = pos + n
                if end > entry.size:
                    raise Mismatch(f"larger than the registered {entry.size} bytes")
                copy = _copy(copy, chunk)
                i = first
                while i < len(wanted) and wanted[i][0] < end:
                    off, length = wanted[i]
                    lo, hi = max(off, pos), min(off + length, end)
                    if lo < hi:
                        bufs[i][lo - off : hi - off] = chunk[lo - pos : hi - pos]
                    if off + length <= end and i == first:
                        first += 1
                    i += 1
                pos = end
        actual = crc32c_hex(crc)
        if pos != entry.size:
            raise Mismatch(f"{pos} bytes, registered {entry.size}")
        if entry.crc32c is not None and actual != entry.crc32c.lower():
            raise Mismatch(f"crc32c {actual}, registered {entry.crc32c}")
    except BaseException:
        if copy is not None:
            copy.abort()
        raise
    copied = copy is not None and _commit(copy)
    return dict(zip(wanted, bufs, strict=True)), copied


def read_placed(
    entry: PlanEntry, placement: Placement, copy: AtomicFile | None, threads: int = READ_THREADS
) -> bool:
    """Read the POSIX copy `entry` into the memory `placement` gives, verifying its size and
    crc32c; whether `copy` (if given) was committed. Raises Mismatch (the bytes placed are then
    those of a bad copy: the caller reads another copy into the same memory, or fails)."""
    try:
        try:
            fd = os.open(entry.location, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceError(f"restore source {entry.location} does not exist") from None
        try:
            copy = _read_placed(fd, entry, placement, copy, threads)
        finally:
            os.close(fd)
    except BaseException:
        if copy is not None:
            copy.abort()
        raise
    return copy is not None and _commit(copy)


def _read_placed(
    fd: int, entry: PlanEntry, placement: Placement, copy: AtomicFile | None, threads: int
) -> AtomicFile | None:
    size = os.fstat(fd).st_size
    if size != entry.size:
        raise Mismatch(f"{size} bytes, registered {entry.size}")
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    pieces = _pieces(placement.segments(lambda off, n: _pread(fd, off, n)), entry.size)
    if copy is None and threads > 1 and len(pieces) > 1:
        crcs = _in_parallel(fd, pieces, threads)
    else:
        crcs = []
        for piece in pieces:
            view, piece_crc = _read_piece(fd, piece)
            crcs.append(piece_crc)
            copy = _copy(copy, view, piece_crc)
    crc = 0
    for piece, piece_crc in zip(pieces, crcs, strict=True):
        crc = combine(crc, piece_crc, piece.length)
    _verify(entry, crc)
    return copy


def _verify(entry: PlanEntry, crc: int) -> None:
    """A placed or streamed read's combined crc32c against the registered one: bytes already
    in the tensors must verify, or the next copy replaces them."""
    # guard: placed-read-crc
    actual = crc32c_hex(crc)
    if entry.crc32c is not None and actual != entry.crc32c.lower():
        raise Mismatch(f"crc32c {actual}, registered {entry.crc32c}")


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def read_streamed(
    sources: Sources, entry: PlanEntry, placement: Placement, copy: AtomicFile | None
) -> bool:
    """As `read_placed`, for a copy that is one stream (S3, a peer's endpoint): the file read
    once front to back straight into the memory `placement` gives, each piece through crc32c as
    it lands; whether `copy` (if given) was committed. Raises Mismatch."""
    try:
        with sources.stream(entry) as readinto:
            copy = _stream_into(readinto, entry, placement, copy)
    except BaseException:
        if copy is not None:
            copy.abort()
        raise
    return copy is not None and _commit(copy)


def _stream_into(
    readinto: Callable[[memoryview], int],
    entry: PlanEntry,
    placement: Placement,
    copy: AtomicFile | None,
) -> AtomicFile | None:
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
            copy = _copy(copy, view, piece_crc)
        pos += seg.length
    if pos != entry.size:
        raise ValueError(f"placement: segments end at {pos}, the file at {entry.size}")
    if fill(memoryview(bytearray(1))):
        raise Mismatch(f"larger than the registered {entry.size} bytes")
    _verify(entry, crc)
    return copy


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of reader threads: made once, not per file (starting threads costs
    more than reading a small file)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, "tierpoint-read")
        return pool


def _in_parallel(fd: int, pieces: Sequence[Segment], threads: int) -> list[int]:
    """The pieces' crc32c, read on the pool. On a failure every piece still queued is cancelled
    and every running one waited for: none may write into the memory after this returns (the
    next copy is read into it) or read the descriptor after it is closed."""
    futures = [_pool(threads).submit(_read_piece, fd, p) for p in pieces]
    try:
        return [f.result()[1] for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        wait(futures)
        raise


def _pieces(segments: Iterable[Segment], size: int) -> list[Segment]:
    """The segments cut into pieces of at most PIECE bytes, checked to tile [0, size)."""
    pieces: list[Segment] = []
    pos = 0
    for seg in segments:
        if seg.offset != pos or seg.length < 0:
            raise ValueError(f"placement: a segment at {seg.offset}, expected {pos}")
        for start in range(0, seg.length, PIECE):
            n = min(PIECE, seg.length - start)
            view = None if seg.view is None else seg.view[start : start + n]
            pieces.append(Segment(pos + start, n, view, seg.filled))
        pos += seg.length
    if pos != size:
        raise ValueError(f"placement: segments end at {pos}, the file at {size}")
    return pieces


def _pread(fd: int, offset: int, length: int) -> memoryview:
    view = memoryview(bytearray(length))
    got = 0
    while got < length:
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return view[:got]


def _read_piece(fd: int, piece: Segment) -> tuple[memoryview, int]:
    """The piece's bytes, read into its view (or this thread's scratch buffer) unless filled,
    and their crc32c."""
    view = piece.view if piece.view is not None else chunk_buffer(PIECE)[: piece.length]
    if not piece.filled:
        got = 0
        while got < piece.length:
            n = os.preadv(fd, [view[got:]], piece.offset + got)
            if not n:
                raise Mismatch(f"ends at {piece.offset + got}: shorter than registered")
            got += n
    return view, update(0, view)


def read_ranges(
    sources: Sources, entry: PlanEntry, wanted: list[Range], crcs: Mapping[Range, str]
) -> tuple[dict[Range, bytearray], int]:
    """The `wanted` ranges, each verified against its crc32c in `crcs`, and the bytes fetched."""
    spans = coalesce(wanted)

    def fetch(span: tuple[int, int]) -> bytes:
        start, end = span
        data = sources.read_range(entry, start, end - start)
        if len(data) != end - start:
            raise Mismatch(
                f"bytes {start}-{end - 1} gave {len(data)} bytes: shorter than registered"
            )
        return data

    workers = min(RANGED_GETS_IN_FLIGHT, len(spans))
    if workers <= 1:
        fetched = [fetch(s) for s in spans]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            fetched = list(pool.map(fetch, spans))
    got: dict[Range, bytearray] = {}
    span_index = 0
    for off, length in sorted(wanted):
        while spans[span_index][1] < off + length:
            span_index += 1
        start = spans[span_index][0]
        piece = bytearray(fetched[span_index][off - start : off - start + length])
        actual = crc32c_hex(update(0, piece))
        if actual != crcs[(off, length)].lower():
            raise Mismatch(
                f"bytes {off}-{off + length - 1}: crc32c {actual}, "
                f"{crcs[(off, length)]} in .metadata"
            )
        got[(off, length)] = piece
    return got, sum(len(d) for d in fetched)


def _copy(
    copy: AtomicFile | None, chunk: bytes | memoryview, crc: int | None = None
) -> AtomicFile | None:
    """Writes the chunk; a copy that cannot be written is dropped, never failing the read."""
    if copy is None:
        return None
    try:
        copy.write(chunk, crc)
    except OSError as e:
        _gave_up(copy, e)
        copy.abort()
        return None
    return copy


def _commit(copy: AtomicFile) -> bool:
    try:
        copy.commit()
    except OSError as e:
        _gave_up(copy, e)
        copy.abort()
        return False
    return True


def _gave_up(copy: AtomicFile, e: OSError) -> None:
    warnings.warn(
        f"tierpoint: could not write a local copy to {copy.final} ({e}); the load goes on",
        stacklevel=4,
    )
