"""A file from its k data stripes alone: no arithmetic, each stripe's payload read off its stream
straight to where its bytes belong in the file.

A data stripe's fragment of a segment is liberasurecode's header (HEADER bytes) then the
payload: data stripe i carries bytes [i*p, (i+1)*p) of the segment (p the payload size, the last
stripes' tails padding). So with every data stripe good the file is their payloads laid side by
side, segment by segment: each stripe is read on a thread of its own, its header and padding
into scratch memory and its file bytes straight into the caller's buffer (or written at their
offset in the caller's file), hashed as they land. Every stripe's size and crc32c and the file's
(the pieces' crc32c combined in file order, never hashed twice) must match before `join`
returns. The layout is checked once per code against pyeclib's own decode (`joinable`); a code
whose fragments are not laid out so is decoded by pyeclib instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from typing import BinaryIO, Protocol, TypeVar

from ..errors import TierpointError
from ..hashing import chunk_buffer, combine, crc32c_hex, update
from .code import Code
from .stripes import FileMismatchError, _driver, fragment_size, segment_sizes, stripe_size

HEADER = 80  # liberasurecode's fragment header
SCRATCH = 1 << 20


class StripeRef(Protocol):
    """A stripe as the caller lists it (`fetch.StripeRef`)."""

    @property
    def index(self) -> int: ...

    @property
    def crc32c(self) -> str: ...

    @property
    def where(self) -> str: ...


class Target(Protocol):
    """Where the file's bytes go: `into` gives the memory the file's bytes from `offset` are
    read into (at most `n` bytes, fewer up to a boundary of its own); `landed` is told once they
    are there and gives the bytes the file holds there, which the file's crc32c covers (`view`
    itself, or what a placement read there before: the stripe's bytes were then dropped)."""

    def into(self, offset: int, n: int) -> memoryview: ...

    def landed(self, offset: int, view: memoryview) -> memoryview: ...


class InMemory:
    """The file in one buffer: each stripe's bytes read straight into their place."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer

    def into(self, offset: int, n: int) -> memoryview:
        return self.buffer[offset : offset + n]

    def landed(self, offset: int, view: memoryview) -> memoryview:
        return view


class InFile:
    """The file written at its offsets (`os.pwrite`) from each reading thread's scratch memory."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def into(self, offset: int, n: int) -> memoryview:
        return chunk_buffer(SCRATCH)[:n]

    def landed(self, offset: int, view: memoryview) -> memoryview:
        left, at = view, offset
        while left:
            written = os.pwrite(self.fd, left, at)
            left, at = left[written:], at + written
        return view


@functools.cache
def joinable(code: Code) -> bool:
    """Whether this code's data fragments are laid out as this module reads them (checked against
    pyeclib's decode of a few sizes, segment boundaries and padding included)."""
    driver = _driver(code)
    for n in (1, code.k * 7 + 3, 3 * 4096 + 5):
        data = bytes((i * 131 + 7) % 251 for i in range(n))
        fragments = driver.encode(data)[: code.k]
        payload = fragment_size(code, n) - HEADER
        if any(len(f) != HEADER + payload for f in fragments):
            return False
        if b"".join(f[HEADER:] for f in fragments)[:n] != data:
            return False
    return True


R = TypeVar("R", bound=StripeRef)
Piece = tuple[int, int, int]  # (offset in the file, length, crc32c)


def _read(readinto: Callable[[memoryview], int], view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _stripe(
    code: Code, file_size: int, ref: StripeRef, src: BinaryIO, target: Target
) -> list[Piece]:
    """Data stripe `ref` off `src` into `target`: its pieces of the file, once the stripe's size
    and crc32c matched (StripeCorruptError-like problems raised as _Bad)."""
    index, pieces, crc, offset = ref.index, [], 0, 0
    readinto: Callable[[memoryview], int] = src.readinto  # type: ignore[attr-defined]
    for segment in segment_sizes(file_size):
        payload = fragment_size(code, segment) - HEADER
        start = index * payload
        land = max(0, min(payload, segment - start))
        parts = [(None, HEADER), (offset + start, land), (None, payload - land)]
        for at, n in parts:
            while n:
                view = target.into(at, min(n, SCRATCH)) if at is not None else None
                if view is None:
                    view = chunk_buffer(SCRATCH)[: min(n, SCRATCH)]
                step = len(view)
                if not step or _read(readinto, view) < step:
                    raise _Bad(f"shorter than its {stripe_size(code, file_size)} bytes")
                piece = update(0, view)
                crc = combine(crc, piece, step)
                if at is not None:
                    held = target.landed(at, view)
                    pieces.append((at, step, piece if held is view else update(0, held)))
                    at += step
                n -= step
        offset += segment
    if _read(readinto, memoryview(bytearray(1))):
        raise _Bad(f"longer than its {stripe_size(code, file_size)} bytes")
    # guard: joined-stripe-crc
    if crc32c_hex(crc) != ref.crc32c:
        raise _Bad(f"crc32c {crc32c_hex(crc)}, recorded {ref.crc32c}")
    return pieces


@dataclass(frozen=True)
class Left:
    """A data stripe left out of the join: why, and whether its bytes arrived and were not the
    encoder's (`mismatch`: worth reporting) or it could not be read (a holder down says nothing
    of the bytes)."""

    why: str
    mismatch: bool


class _Bad(Exception):
    """This stripe cannot be used: why."""


def join(
    code: Code,
    file_size: int,
    file_crc32c: str,
    data: Sequence[R],
    open_stripe: Callable[[R], BinaryIO],
    target: Target,
) -> dict[int, Left]:
    """The file from its k data stripes `data`, read at once into `target` and checked: {} when
    every stripe and the file matched; else the stripes that could not be read or did not match,
    and why (the caller decodes from the others and parity; `target` then holds no file).
    FileMismatchError when every stripe matched and the file does not."""
    if sorted(r.index for r in data) != list(range(code.k)):
        raise ValueError(f"{code} joins data stripes 0..{code.k - 1}")

    def one(ref: R) -> list[Piece] | Left:
        try:
            with open_stripe(ref) as src:
                return _stripe(code, file_size, ref, src, target)
        except _Bad as e:
            return Left(f"stripe {ref.index} from {ref.where}: {e}", mismatch=True)
        # guard: joined-stripe-read-error-is-a-lost-stripe
        except (OSError, HTTPException, TierpointError) as e:
            return Left(f"stripe {ref.index} from {ref.where}: {e!r}", mismatch=False)

    with ThreadPoolExecutor(code.k, "tierpoint-stripe") as pool:
        results = list(pool.map(one, data))
    left = {r.index: got for r, got in zip(data, results, strict=True) if isinstance(got, Left)}
    if left:
        return left
    crc = 0
    size = 0
    for at, n, piece in sorted(p for got in results if not isinstance(got, Left) for p in got):
        if at != size:
            raise FileMismatchError(f"the stripes' pieces leave a gap at byte {size}")
        crc = combine(crc, piece, n)
        size += n
    # guard: joined-file-crc
    if size != file_size or crc32c_hex(crc) != file_crc32c:
        raise FileMismatchError(
            f"joined {size} bytes, crc32c {crc32c_hex(crc)}: the file is {file_size} bytes, "
            f"crc32c {file_crc32c}"
        )
    return {}


__all__ = ["HEADER", "InFile", "InMemory", "Left", "Target", "join", "joinable"]
