"""The stripe format: a file cut into segments, each segment coded into k+m fragments, fragment i
of every segment appended to stripe i.

One format for the service (which encodes a node's files) and the client (which decodes them),
so both import it from here. A segment is SEGMENT_BYTES of the file (the last one shorter); its
fragments are pyeclib's (ISA-L Reed-Solomon, Vandermonde): each carries a small header, so the
size of every stripe follows from the file's size alone and a reader knows where each segment's
fragment starts without an index. Working a segment at a time keeps memory at a few segments
whatever the file's size.

Every stripe has its own crc32c; decoding computes each used stripe's crc32c and the file's
while it goes, and the caller publishes the result only when all of them match (decode_path).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from pyeclib.ec_iface import ECDriver

from ..hashing import crc32c_hex, update
from .code import Code

EC_TYPE = "isa_l_rs_vand"
SEGMENT_BYTES = 4 * 1024 * 1024


class _Driver(Protocol):
    def encode(self, data: bytes) -> list[bytes]: ...

    def decode(self, fragments: list[bytes]) -> bytes: ...

    def get_segment_info(self, data_len: int, segment_size: int) -> dict[str, int]: ...


@functools.cache
def _driver(code: Code) -> _Driver:
    driver: _Driver = ECDriver(k=code.k, m=code.m, ec_type=EC_TYPE)
    return driver


@dataclass(frozen=True)
class StripeInfo:
    """Stripe `index` of a file (0..k-1 data, k..k+m-1 parity): its size and crc32c."""

    index: int
    size: int
    crc32c: str


class StripeCorruptError(ValueError):
    """A stripe's bytes do not match its recorded size or crc32c: treat that stripe as lost."""

    def __init__(self, index: int, detail: str) -> None:
        self.index = index
        super().__init__(f"stripe {index}: {detail}")


class FileMismatchError(ValueError):
    """The decoded bytes do not match the file's registered size or crc32c."""


def segment_sizes(file_size: int) -> list[int]:
    """The file's segments, in order: SEGMENT_BYTES each, the last one what is left (none for
    an empty file)."""
    full, rest = divmod(file_size, SEGMENT_BYTES)
    return [SEGMENT_BYTES] * full + ([rest] if rest else [])


def fragment_size(code: Code, segment: int) -> int:
    """Bytes of one fragment (header included) of a segment of `segment` bytes."""
    return _driver(code).get_segment_info(segment, segment)["fragment_size"]


def stripe_size(code: Code, file_size: int) -> int:
    """Bytes of each stripe (data or parity alike) of a file of `file_size` bytes."""
    full, rest = divmod(file_size, SEGMENT_BYTES)
    size = full * fragment_size(code, SEGMENT_BYTES) if full else 0
    return size + (fragment_size(code, rest) if rest else 0)


def _read_exact(src: BinaryIO, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = src.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def encode(
    code: Code, src: BinaryIO, file_size: int, sinks: Sequence[BinaryIO]
) -> list[StripeInfo]:
    """Read `file_size` bytes of `src` and write stripe i to sinks[i]; each stripe's size and
    crc32c, computed in the same pass. A source shorter than `file_size` is a ValueError."""
    if len(sinks) != code.width:
        raise ValueError(f"{code} writes {code.width} stripes, not {len(sinks)}")
    driver = _driver(code)
    crcs = [0] * code.width
    sizes = [0] * code.width
    for segment in segment_sizes(file_size):
        data = _read_exact(src, segment)
        if len(data) != segment:
            raise ValueError(f"the file ended before its {file_size} bytes")
        for i, fragment in enumerate(driver.encode(data)):
            sinks[i].write(fragment)
            crcs[i] = update(crcs[i], fragment)
            sizes[i] += len(fragment)
    return [StripeInfo(i, sizes[i], crc32c_hex(crcs[i])) for i in range(code.width)]


@dataclass(frozen=True)
class StripeSource:
    """A stripe to decode from: its bytes and what it must match."""

    index: int
    reader: BinaryIO
    crc32c: str


def choose(code: Code, available: Sequence[int]) -> list[int]:
    """The k stripes to read: data stripes first (when all k are there liberasurecode joins their
    fragments, no arithmetic), then the fewest parity stripes that make up k."""
    ordered = sorted(set(available))
    if len(ordered) < code.k:
        raise ValueError(f"{code} needs {code.k} stripes, {len(ordered)} available")
    return ordered[: code.k]


def decode(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Mapping[int, StripeSource],
    out: BinaryIO,
) -> None:
    """Decode the file from exactly k stripes into `out`, checking every stripe's size and crc32c
    and the file's. Raises StripeCorruptError (that stripe is lost: retry without it) or
    FileMismatchError. A stripe's crc32c covers all of it, so only its end proves it: `out` may
    hold bytes decoded from a bad stripe when this raises, and the caller publishes `out` only
    when it returns (decode_path does)."""
    for data in _decoded(code, file_size, file_crc32c, stripes):
        out.write(data)


def rebuild(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Mapping[int, StripeSource],
    index: int,
    out: BinaryIO,
) -> StripeInfo:
    """Stripe `index` cut again from exactly k other stripes into `out`: each segment decoded,
    then coded again and only its fragment `index` kept. The same checks as `decode` (every
    stripe read and the decoded file), and the same rule: `out` is good only when this returns.
    The codec is deterministic, so the result is the encoder's stripe: the caller compares the
    size and crc32c returned with the ones the encoder recorded before it keeps the bytes."""
    if not 0 <= index < code.width or index in stripes:
        raise ValueError(f"{code} has no stripe {index} to rebuild from {sorted(stripes)}")
    driver = _driver(code)
    crc = size = 0
    for data in _decoded(code, file_size, file_crc32c, stripes):
        fragment = driver.encode(data)[index]
        out.write(fragment)
        crc = update(crc, fragment)
        size += len(fragment)
    return StripeInfo(index, size, crc32c_hex(crc))


def _decoded(
    code: Code, file_size: int, file_crc32c: str, stripes: Mapping[int, StripeSource]
) -> Iterator[bytes]:
    """The file's segments decoded from exactly k stripes, in order; once the last is taken,
    every stripe's size and crc32c and the file's are checked (StripeCorruptError,
    FileMismatchError), so a caller's work is good only when the iteration ends cleanly."""
    if len(stripes) != code.k:
        raise ValueError(f"{code} decodes from exactly {code.k} stripes, not {len(stripes)}")
    driver = _driver(code)
    used = sorted(stripes)
    crcs = dict.fromkeys(used, 0)
    file_crc = 0
    written = 0
    expected = stripe_size(code, file_size)
    for segment in segment_sizes(file_size):
        frag = fragment_size(code, segment)
        fragments = []
        for i in used:
            piece = _read_exact(stripes[i].reader, frag)
            crcs[i] = update(crcs[i], piece)
            if len(piece) != frag:
                raise StripeCorruptError(i, f"shorter than its {expected} bytes")
            fragments.append(piece)
        try:
            data = driver.decode(fragments)
        except Exception:
            # pyeclib refuses fragments whose headers do not fit together: the bad stripe is
            # the one whose crc32c fails, found by reading every stripe to its end.
            _drain(stripes, crcs)
            _check_crcs(stripes, crcs)
            raise
        yield data
        file_crc = update(file_crc, data)
        written += len(data)
    for i in used:
        if stripes[i].reader.read(1):
            raise StripeCorruptError(i, f"longer than its {expected} bytes")
    _check_crcs(stripes, crcs)
    # guard: erasure-file-crc
    if written != file_size or crc32c_hex(file_crc) != file_crc32c:
        raise FileMismatchError(
            f"decoded {written} bytes, crc32c {crc32c_hex(file_crc)}: the file is {file_size} "
            f"bytes, crc32c {file_crc32c}"
        )


def _drain(stripes: Mapping[int, StripeSource], crcs: dict[int, int]) -> None:
    for i, stripe in stripes.items():
        while chunk := stripe.reader.read(1 << 20):
            crcs[i] = update(crcs[i], chunk)


def _check_crcs(stripes: Mapping[int, StripeSource], crcs: Mapping[int, int]) -> None:
    for i, crc in crcs.items():
        # guard: erasure-stripe-crc
        if crc32c_hex(crc) != stripes[i].crc32c:
            raise StripeCorruptError(i, f"crc32c {crc32c_hex(crc)}, recorded {stripes[i].crc32c}")
