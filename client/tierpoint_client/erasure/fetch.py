"""A file restored from its stripes wherever they are held: any k of them fetched in parallel,
each verified as it arrives, then decoded and the file verified, falling back stripe by stripe.

What the client's restore does with a coded copy: the plan lists the set's stripes (index,
size, crc32c, where to read it); `open_stripe` opens one for reading (a holder's data endpoint,
a file). The k stripes read first are the data stripes: while every one of them is good the file
is joined from them, their payloads written at their offsets of a temporary file as they arrive
(`join`), and renamed into place once they and the file matched. A stripe that cannot be read
(a holder down) or does not match its size or crc32c is treated as lost and the next one (a
parity stripe) is read instead: each lands in a temporary file beside the destination, which is
written only by `decode_path`. Either way nothing is under its name until the whole file matched
its registered crc32c.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import BinaryIO

from ..errors import TierpointError
from ..hashing import crc32c_hex, update
from .code import Code
from .files import Decoded, NotEnoughStripesError, StripeFile, decode_path, rebuild_path
from .join import InFile, Left, join, joinable
from .stripes import stripe_size

CHUNK = 1 << 20


@dataclass(frozen=True)
class StripeRef:
    """One stripe of a set as a restore plan lists it: `where` is the caller's (a URL, a path)."""

    index: int
    crc32c: str
    where: str


@dataclass(frozen=True)
class _Problem:
    why: str
    # the stripe's bytes arrived and were not the encoder's (else it could not be read)
    mismatch: bool


def _fetch(
    code: Code,
    file_size: int,
    ref: StripeRef,
    open_stripe: Callable[[StripeRef], BinaryIO],
    dest: Path,
) -> _Problem | None:
    """Stripe `ref` into `dest`, checked: None when good, else why it is not used."""
    expected = stripe_size(code, file_size)
    crc = size = 0
    try:
        with open_stripe(ref) as src, open(dest, "wb") as out:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > expected:
                    why = f"stripe {ref.index} from {ref.where}: longer than {expected} bytes"
                    return _Problem(why, mismatch=True)
                crc = update(crc, chunk)
                out.write(chunk)
    # guard: stripe-read-error-is-a-lost-stripe
    except (OSError, HTTPException, TierpointError) as e:
        # Cannot be read: refused, reset, cut off mid-body (IncompleteRead), a source's error.
        # guard: only-a-mismatched-stripe-is-reported
        return _Problem(f"stripe {ref.index} from {ref.where}: {e!r}", mismatch=False)
    if size != expected or crc32c_hex(crc) != ref.crc32c:
        why = (
            f"stripe {ref.index} from {ref.where}: {size} bytes, crc32c {crc32c_hex(crc)}; "
            f"expected {expected}, {ref.crc32c}"
        )
        return _Problem(why, mismatch=True)
    return None


def _joined(
    code: Code,
    file_size: int,
    file_crc32c: str,
    candidates: Sequence[StripeRef],
    open_stripe: Callable[[StripeRef], BinaryIO],
    dest: Path,
) -> dict[int, Left] | None:
    """`dest` joined from the k data stripes (`join.join`, each read straight to its offsets of
    a temporary file, renamed into place once every stripe and the file matched): None when it
    was; else the data stripes that could not be read or did not match (nothing at `dest`)."""
    data = [s for s in candidates if s.index < code.k]
    if len(data) < code.k or not joinable(code):
        return {}
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.joined")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            rejected = join(code, file_size, file_crc32c, data, open_stripe, InFile(fd))
            if not rejected:
                os.ftruncate(fd, file_size)
                os.fsync(fd)
        finally:
            os.close(fd)
        if rejected:
            return rejected
        tmp.replace(dest)
        return None
    finally:
        tmp.unlink(missing_ok=True)


def restore_file(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Sequence[StripeRef],
    open_stripe: Callable[[StripeRef], BinaryIO],
    dest: Path,
) -> Decoded:
    """Fetch k good stripes of `stripes` (data first, k at a time in parallel), decode them into
    `dest` and check the file; NotEnoughStripesError, and nothing at `dest`, when fewer than k
    of them are good. The stripes' temporary files are removed whatever happens."""

    # Every data stripe listed: the file is their payloads side by side, written as they arrive.
    candidates = sorted(stripes, key=lambda s: s.index)
    dropped = _joined(code, file_size, file_crc32c, candidates, open_stripe, dest)
    if dropped is None:
        return Decoded(list(range(code.k)))

    def use(good: list[StripeFile]) -> Decoded:
        return decode_path(code, file_size, file_crc32c, good, dest)

    return _with_k_good(code, file_size, stripes, open_stripe, dest, use, dropped)


def rebuild_stripe(
    code: Code,
    file_size: int,
    file_crc32c: str,
    stripes: Sequence[StripeRef],
    open_stripe: Callable[[StripeRef], BinaryIO],
    index: int,
    dest: Path,
) -> Decoded:
    """Stripe `index` of the file cut again into `dest` from k good stripes of the others,
    fetched and checked as `restore_file` fetches them (`files.rebuild_path`: the decoded file
    checked against its registered size and crc32c before anything is at `dest`);
    `Decoded.rebuilt` says what was cut. NotEnoughStripesError when fewer than k are good."""

    def use(good: list[StripeFile]) -> Decoded:
        return rebuild_path(code, file_size, file_crc32c, good, index, dest)

    others = [s for s in stripes if s.index != index]
    return _with_k_good(code, file_size, others, open_stripe, dest, use)


def _with_k_good(
    code: Code,
    file_size: int,
    stripes: Sequence[StripeRef],
    open_stripe: Callable[[StripeRef], BinaryIO],
    dest: Path,
    use: Callable[[list[StripeFile]], Decoded],
    dropped: Mapping[int, Left] | None = None,
) -> Decoded:
    """`use` on k stripes fetched good, fetching others for any it or the fetch finds bad;
    `dropped`: stripes a join already found bad, never fetched again."""
    candidates = sorted(stripes, key=lambda s: s.index)
    dropped = dropped or {}
    rejected = {index: stripe.why for index, stripe in dropped.items()}
    mismatched = {index: stripe.why for index, stripe in dropped.items() if stripe.mismatch}
    good: dict[int, StripeFile] = {}
    temps = {
        s.index: dest.with_name(f".{dest.name}.stripe{s.index}.{os.getpid()}") for s in stripes
    }
    try:
        with ThreadPoolExecutor(max_workers=code.k) as pool:
            while len(good) < code.k:
                left = [s for s in candidates if s.index not in good and s.index not in rejected]
                batch = left[: code.k - len(good)]
                if not batch:
                    raise NotEnoughStripesError(code, rejected, len(stripes), mismatched)
                results = pool.map(
                    lambda s: _fetch(code, file_size, s, open_stripe, temps[s.index]), batch
                )
                for ref, problem in zip(batch, list(results), strict=True):
                    if problem is None:
                        good[ref.index] = StripeFile(ref.index, temps[ref.index], ref.crc32c)
                    else:
                        rejected[ref.index] = problem.why
                        if problem.mismatch:
                            mismatched[ref.index] = problem.why
                if len(good) == code.k:
                    try:
                        done = use(list(good.values()))
                    except NotEnoughStripesError as e:
                        # A stripe changed on this disk since it was checked: fetch another.
                        for index, why in e.rejected.items():
                            good.pop(index, None)
                            rejected[index] = why
                        continue
                    done.rejected = {**rejected, **done.rejected}
                    done.mismatched = {**mismatched, **done.mismatched}
                    return done
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


__all__ = ["StripeRef", "rebuild_stripe", "restore_file"]
