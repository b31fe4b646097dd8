"""A coded copy's data stripes read straight into the memory a placement gives (the tensors DCP
loads into), as a peer copy's stripes are: the placement first reads the first bytes of each item
(`pread`: a ranged GET of the data stripe that holds them) to decide where its bytes go, then
each data stripe's payloads land in that memory as they come off the socket (`erasure.join`),
and bytes the placement already holds (read to decide) are hashed as they lie there, the
stripe's copy of them read and dropped. So a load from stripes holds no buffer of the file.
Anything that keeps this from working (a ranged read refused, a holder down while the placement
decides) leaves the read to the buffered path, which decodes around a lost data stripe."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from http.client import HTTPException

from tierpoint_client import peer
from tierpoint_client.erasure import Code
from tierpoint_client.erasure.join import HEADER, SCRATCH
from tierpoint_client.erasure.stripes import SEGMENT_BYTES, fragment_size
from tierpoint_client.errors import TierpointError
from tierpoint_client.hashing import chunk_buffer
from tierpoint_client.models import PlanEntry, PlanStripe
from tierpoint_client.sources.base import Mismatch, Placement, Segment
from tierpoint_client.sources.placing import pieces
from tierpoint_client.transport import read_full


def stripe_entry(entry: PlanEntry, stripe: PlanStripe) -> PlanEntry:
    """A stripe of `entry` as the copy of a file the peer transport reads."""
    return PlanEntry(
        f"{entry.path} (stripe {stripe.index})",
        stripe.size,
        stripe.crc32c,
        entry.tier,
        "peer",
        stripe.node,
        stripe.url,
        url=stripe.url,
    )


class NotPlaced(Exception):
    """The placement could not be made from the stripes: read through a buffer instead."""


class Placed:
    """`erasure.join`'s target over a placement's pieces (`placing.pieces`)."""

    def __init__(self, parts: Sequence[Segment]) -> None:
        self.parts = parts
        self.starts = [p.offset for p in parts]

    def _at(self, offset: int) -> tuple[Segment, int]:
        part = self.parts[bisect.bisect_right(self.starts, offset) - 1]
        return part, offset - part.offset

    def into(self, offset: int, n: int) -> memoryview:
        part, rel = self._at(offset)
        n = min(n, part.length - rel)
        if part.view is None or part.filled:
            return chunk_buffer(SCRATCH)[: min(n, SCRATCH)]
        return part.view[rel : rel + n]

    def landed(self, offset: int, view: memoryview) -> memoryview:
        part, rel = self._at(offset)
        if part.filled and part.view is not None:
            # What the file's crc32c covers here: the bytes the placement holds, not the
            # stripe's copy of them (dropped), so a head read wrong fails the file.
            # guard: placed-stripes-hash-held-bytes
            return part.view[rel : rel + len(view)]
        return view


def placed(
    entry: PlanEntry,
    code: Code,
    data: dict[int, PlanStripe],
    token: str | None,
    placement: Placement,
) -> Placed:
    """The placement's pieces, its items' first bytes read from the data stripes; NotPlaced when
    they could not be read."""

    def pread(offset: int, length: int) -> memoryview:
        out = bytearray()
        end = min(offset + length, entry.size)
        full = fragment_size(code, SEGMENT_BYTES)
        while offset + len(out) < end:
            pos = offset + len(out)
            index_of_segment, within = divmod(pos, SEGMENT_BYTES)
            segment = min(SEGMENT_BYTES, entry.size - index_of_segment * SEGMENT_BYTES)
            payload = fragment_size(code, segment) - HEADER
            index, in_payload = divmod(within, payload)
            take = min(end - pos, payload - in_payload, segment - within)
            at = index_of_segment * full + HEADER + in_payload
            stripe = data[index]
            view = memoryview(bytearray(take))
            try:
                with peer.ranged(stripe_entry(entry, stripe), token, at, take) as (readinto, size):
                    if size != stripe.size or read_full(readinto, view) < take:
                        raise NotPlaced(f"stripe {index}: {size} bytes, recorded {stripe.size}")
            except (TierpointError, OSError, HTTPException, Mismatch) as e:
                raise NotPlaced(f"stripe {index} from {stripe.url}: {e}") from None
            out += view
        return memoryview(out)

    return Placed(pieces(placement.segments(pread), entry.size))
