"""Stripes as files: encode a file into k+m stripe files, decode a file from any k of them.

Both write under a temporary name in the destination's folder, fsync and rename, so a crash or a
failed check leaves nothing under a final name (the same rule as every copy in the project).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .code import Code
from .stripes import (
    FileMismatchError,
    StripeCorruptError,
    StripeInfo,
    StripeSource,
    choose,
    decode,
    encode,
    rebuild,
)


@contextlib.contextmanager
def _atomic(dest: Path) -> Iterator[BinaryIO]:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)


def encode_path(code: Code, src: Path, dests: Sequence[Path]) -> list[StripeInfo]:
    """Stripe i of the file `src` written atomically to dests[i]; each stripe's size and crc32c."""
    if len(dests) != code.width:
        raise ValueError(f"{code} writes {code.width} stripes, not {len(dests)}")
    with contextlib.ExitStack() as stack:
        sinks = [stack.enter_context(_atomic(d)) for d in dests]
        with open(src, "rb") as f:
            return encode(code, f, os.fstat(f.fileno()).st_size, sinks)


@dataclass(frozen=True)
class StripeFile:
    """A stripe held in a file, with the crc32c it must match."""

    index: int
    path: Path
    crc32c: str


@dataclass
class Decoded:
    """Which stripes a decode used, and which it found corrupt and left out; `mismatched`: those
    of them whose bytes arrived whole and were not the encoder's (what a reader reports; a
    stripe that could not be read says nothing of the bytes its holder keeps)."""

    used: list[int]
    rejected: dict[int, str] = field(default_factory=dict)
    mismatched: dict[int, str] = field(default_factory=dict)
    # A rebuild's: the stripe it cut again (its size and crc32c).
    rebuilt: StripeInfo | None = None


class NotEnoughStripesError(ValueError):
    """Fewer than k stripes passed their checks: the file cannot be decoded from this set.
    `mismatched` as in `Decoded`."""

    def __init__(
        self,
        code: Code,
        rejected: Mapping[int, str],
        available: int,
        mismatched: Mapping[int, str] | None = None,
    ) -> None:
        self.rejected = dict(rejected)
        self.mismatched = dict(mismatched or {})
        why = "; ".join(f"{msg}" for msg in rejected.values()) or "none rejected"
        super().__init__(
            f"{code} needs {code.k} good stripes; {available} available, "
            f"{len(rejected)} rejected ({why})"
        )


def decode_path(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Sequence[StripeFile],
    dest: Path,
) -> Decoded:
    """Decode the file into `dest` (atomically) from k of `stripes`, data stripes first. A stripe
    that fails its size or crc32c is left out and the decode starts again from the others, so
    nothing decoded from it reaches `dest`; NotEnoughStripesError when fewer than k are good.
    A FileMismatchError (every stripe checked, the file not) means the set itself is wrong."""

    def once(sources: Mapping[int, StripeSource], out: BinaryIO) -> None:
        decode(code, file_size, file_crc32c, sources, out)

    return _from_k_good(code, stripes, dest, once)


def rebuild_path(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Sequence[StripeFile],
    index: int,
    dest: Path,
) -> Decoded:
    """Stripe `index` cut again into `dest` (atomically) from k of the other `stripes`, with the
    rules of `decode_path`: a stripe that fails its check is left out and the work starts again
    from the others, nothing reaches `dest` unless the decoded file matched its registered size
    and crc32c. `Decoded.rebuilt` is the stripe's size and crc32c, for the caller to compare
    with the encoder's."""
    rebuilt: list[StripeInfo] = []

    def once(sources: Mapping[int, StripeSource], out: BinaryIO) -> None:
        rebuilt.append(rebuild(code, file_size, file_crc32c, sources, index, out))

    decoded = _from_k_good(code, [s for s in stripes if s.index != index], dest, once)
    decoded.rebuilt = rebuilt[-1]
    return decoded


def _from_k_good(
    code: Code,
    stripes: Sequence[StripeFile],
    dest: Path,
    once: Callable[[Mapping[int, StripeSource], BinaryIO], None],
) -> Decoded:
    """`once` over k of `stripes` (data first) into `dest`, atomically, again without each stripe
    found corrupt until it returns; NotEnoughStripesError when fewer than k are good."""
    by_index = {s.index: s for s in stripes}
    rejected: dict[int, str] = {}
    while True:
        good = [i for i in by_index if i not in rejected]
        if len(good) < code.k:
            raise NotEnoughStripesError(code, rejected, len(by_index))
        used = choose(code, good)
        try:
            with contextlib.ExitStack() as stack:
                sources = {
                    i: StripeSource(
                        i, stack.enter_context(open(by_index[i].path, "rb")), by_index[i].crc32c
                    )
                    for i in used
                }
                with _atomic(dest) as out:
                    once(sources, out)
        except StripeCorruptError as e:
            rejected[e.index] = str(e)
            continue
        return Decoded(used, rejected)


__all__ = [
    "Decoded",
    "FileMismatchError",
    "NotEnoughStripesError",
    "StripeFile",
    "decode_path",
    "rebuild_path",
]
