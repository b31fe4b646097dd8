"""A large peer copy read placed, as a POSIX copy is (see _reads): the file is cut into a few
stripes of contiguous pieces, each stripe one ranged GET on its own kept connection to the
holder's data endpoint, run on the reader threads; every piece lands straight in the memory the
placement gives and goes through crc32c as it lands, and the pieces' checksums, combined in file
order, must match the file's registered size and crc32c.

One GET read front to back puts the whole receive path (the kernel's copy off the socket, then
crc32c) on one core; stripes spread it over the reader threads. A small file is still streamed:
its one request costs less than several.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import wait

from tierpoint_client import peer
from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import chunk_buffer, combine, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.torch._reads import (
    PIECE,
    READ_THREADS,
    Mismatch,
    Placement,
    Segment,
    _pieces,
    _pool,
    _verify,
)
from tierpoint_client.transport import read_full

# Peer copies at least this large are read in stripes: below it, the stripes' extra requests (and
# the placement's head reads, each a request of its own) cost about what the parallel receive
# saves (measured: docs/benchmarks.md, "Recovery from a peer").
STRIPED_MIN = 32 * 1024 * 1024
# A stripe is at least this long: a ranged GET costs a round trip and a server thread's turn.
STRIPE_MIN = 8 * 1024 * 1024


def striped(entry: PlanEntry, copy: object | None) -> bool:
    """Whether a placed read of `entry` is striped: a peer copy of at least STRIPED_MIN bytes
    read without a local copy being written (that one is written in order, from one stream)."""
    return entry.kind == "peer" and copy is None and entry.size >= STRIPED_MIN


def read_striped(
    entry: PlanEntry, placement: Placement, token: str | None, threads: int = READ_THREADS
) -> None:
    """Read the peer copy `entry` into the memory `placement` gives, verifying its size and
    crc32c. Raises Mismatch (the bytes placed are then those of a bad copy: the caller reads
    another copy into the same memory) or SourceError (the copy could not be read)."""

    def pread(offset: int, length: int) -> memoryview:
        view = memoryview(bytearray(length))
        with peer.ranged(entry, token, offset, length) as (readinto, size):
            _check_size(entry, size)
            return view[: read_full(readinto, view)]

    pieces = _pieces(placement.segments(pread), entry.size)
    stripes = cut(pieces, threads)
    futures = [_pool(threads).submit(_read_stripe, entry, token, s) for s in stripes]
    try:
        crcs = [crc for f in futures for crc in f.result()]
    except BaseException:
        # None may write into the memory after this returns: the next copy is read into it.
        for f in futures:
            f.cancel()
        wait(futures)
        raise
    crc = 0
    for piece, piece_crc in zip(pieces, crcs, strict=True):
        crc = combine(crc, piece_crc, piece.length)
    _verify(entry, crc)


def cut(pieces: Sequence[Segment], threads: int) -> list[list[Segment]]:
    """The pieces (in file order) as at most `threads` runs of contiguous pieces of about equal
    length, each at least STRIPE_MIN bytes (but the last)."""
    total = sum(p.length for p in pieces)
    count = max(1, min(threads, total // STRIPE_MIN))
    stripes: list[list[Segment]] = [[]]
    taken = 0
    for piece in pieces:
        # A new stripe once this one has its share of the bytes.
        if stripes[-1] and taken * count >= total * len(stripes) and len(stripes) < count:
            stripes.append([])
        stripes[-1].append(piece)
        taken += piece.length
    return [s for s in stripes if s]


def _check_size(entry: PlanEntry, size: int) -> None:
    if size != entry.size:
        raise Mismatch(f"{size} bytes, registered {entry.size}")


def _read_stripe(entry: PlanEntry, token: str | None, pieces: Sequence[Segment]) -> list[int]:
    """The crc32c of each piece, read by one ranged GET of the stripe into its view (or this
    thread's scratch buffer). A piece the placement holds already (`filled`, read to decide)
    is hashed as held; its bytes in the stripe are taken off the socket and dropped."""
    start = pieces[0].offset
    length = pieces[-1].offset + pieces[-1].length - start
    crcs: list[int] = []
    with peer.ranged(entry, token, start, length) as (readinto, size):
        _check_size(entry, size)
        for piece in pieces:
            target = piece.view if piece.view is not None else chunk_buffer(PIECE)[: piece.length]
            into = chunk_buffer(PIECE)[: piece.length] if piece.filled else target
            if read_full(readinto, into) < piece.length:
                end = piece.offset + piece.length
                raise Mismatch(f"ends before {end}: shorter than registered")
            # guard: striped-read-hashes-placed-bytes
            crcs.append(update(0, target))
        if read_full(readinto, memoryview(bytearray(1))):
            raise SourceError(f"peer copy {entry.url}: a longer body than the range asked")
    return crcs
