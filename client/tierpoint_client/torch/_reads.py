"""The two ways the DCP reader reads one copy of a file, each verifying every byte it returns:

- whole: the file is streamed once through crc32c and must match its registered size and crc32c;
  only the byte ranges the caller needs are kept (and, optionally, every byte is also written to
  a new local copy that is committed only when the whole file matched);
- ranged (S3): only the needed byte ranges are fetched, adjacent ones coalesced into one GET and
  the GETs run in parallel; each item is checked against its own crc32c, which the writer stored
  in `.metadata` (a file that is itself read whole and verified against its registered crc32c).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from tierpoint_client.hashing import CHUNK_SIZE, crc32c_hex, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.restore import Sources
from tierpoint_client.torch._files import AtomicFile

Range = tuple[int, int]  # (offset, length) inside a file

# Ranges closer than this are fetched in one GET: a request costs more than a MiB of transfer.
COALESCE_GAP = 1024 * 1024
RANGED_GETS_IN_FLIGHT = 4


class Mismatch(Exception):
    """The bytes of a copy differ from what was registered for them."""


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
        for chunk in sources.chunks(entry, CHUNK_SIZE):
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


def _copy(copy: AtomicFile | None, chunk: bytes | memoryview) -> AtomicFile | None:
    """Writes the chunk; a copy that cannot be written is dropped, never failing the read."""
    if copy is None:
        return None
    try:
        copy.write(chunk)
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
