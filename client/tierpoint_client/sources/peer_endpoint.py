"""A copy on the peer tier: a file that another node holds, read from that node's data endpoint
over HTTP(S) (`tierpoint_client.peer`) with the API token.

A large copy is read placed, as a POSIX copy is: the file is cut into a few stripes of contiguous
pieces, each stripe one ranged GET on its own kept connection, run on the reader threads; every
piece lands straight in the memory the placement gives and goes through crc32c as it lands, and
the pieces' checksums, combined in file order, must match the file's registered size and crc32c.
One GET read front to back puts the whole receive path (the kernel's copy off the socket, then
crc32c) on one core; stripes spread it over the reader threads. A smaller copy, or one written to
a local copy as it is read (in order), is one GET, streamed: its one request costs less than
several.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from tierpoint_client import peer
from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import chunk_buffer, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.sources.base import Mismatch, Placement, Segment, Sink
from tierpoint_client.sources.placing import (
    PIECE,
    READ_THREADS,
    check,
    in_parallel,
    pieces,
    stream_into,
    target,
)
from tierpoint_client.transport import read_full

# Peer copies at least this large are read in stripes: below it, the stripes' extra requests (and
# the placement's head reads, each a request of its own) cost about what the parallel receive
# saves (measured: docs/benchmarks.md, "Recovery from a peer").
STRIPED_MIN = 32 * 1024 * 1024
# A stripe is at least this long: a ranged GET costs a round trip and a server thread's turn.
STRIPE_MIN = 8 * 1024 * 1024


class PeerSource:
    def __init__(self, entry: PlanEntry, token: str | None, threads: int = READ_THREADS) -> None:
        self.entry = entry
        self.token = token
        self.threads = threads

    def chunks(self, chunk_size: int) -> Generator[memoryview, None, None]:
        # One buffer per thread, filled in place from the socket.
        view = chunk_buffer(chunk_size)
        with peer.stream(self.entry, self.token) as readinto:
            while n := read_full(readinto, view):
                yield view[:n]

    def read_into(self, placement: Placement, copy: Sink | None) -> None:
        if copy is None and self.entry.size >= STRIPED_MIN:
            self._read_striped(placement)
            return
        with peer.stream(self.entry, self.token) as readinto:
            stream_into(readinto, self.entry, placement, copy)

    def _read_striped(self, placement: Placement) -> None:
        entry, token = self.entry, self.token

        def pread(offset: int, length: int) -> memoryview:
            view = memoryview(bytearray(length))
            with peer.ranged(entry, token, offset, length) as (readinto, size):
                _check_size(entry, size)
                return view[: read_full(readinto, view)]

        parts = pieces(placement.segments(pread), entry.size)
        crcs = in_parallel(self._read_stripe, cut(parts, self.threads), self.threads)
        check(entry, parts, crcs)

    def _read_stripe(self, pieces: Sequence[Segment]) -> list[int]:
        """The crc32c of each piece, read by one ranged GET of the stripe into its view (or this
        thread's scratch buffer). A piece the placement holds already (`filled`, read to decide)
        is hashed as held; its bytes in the stripe are taken off the socket and dropped."""
        entry = self.entry
        start = pieces[0].offset
        length = pieces[-1].offset + pieces[-1].length - start
        crcs: list[int] = []
        with peer.ranged(entry, self.token, start, length) as (readinto, size):
            _check_size(entry, size)
            for piece in pieces:
                view = target(piece)
                into = chunk_buffer(PIECE)[: piece.length] if piece.filled else view
                if read_full(readinto, into) < piece.length:
                    end = piece.offset + piece.length
                    raise Mismatch(f"ends before {end}: shorter than registered")
                # guard: striped-read-hashes-placed-bytes
                crcs.append(update(0, view))
            if read_full(readinto, memoryview(bytearray(1))):
                raise SourceError(f"peer copy {entry.url}: a longer body than the range asked")
        return crcs


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
