"""A coded peer copy (a plan entry with `code` and `stripes`): the file decoded from any k of its
stripes, each read from its holder's data endpoint with the API token and checked against its
size and crc32c as it lands, the file checked against its registered size and crc32c before it
is published (`erasure.fetch.restore_file`). Fewer than k good stripes, or a decode that does
not match, is a SourceError: this copy cannot be read, the restore goes on to the next tier."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from tierpoint_client import peer
from tierpoint_client.erasure import (
    FileMismatchError,
    InvalidCodeError,
    NotEnoughStripesError,
    StripeRef,
    parse_code,
    restore_file,
)
from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry


class StripeStream(io.RawIOBase):
    """One stripe's GET as a file: its `readinto` fills the caller's memory off the socket."""

    def __init__(self, entry: PlanEntry, token: str | None) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self._readinto = self._stack.enter_context(peer.stream(entry, token))

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        return self._readinto(memoryview(b).cast("B"))

    def close(self) -> None:
        self._stack.close()
        super().close()


# Told of a stripe whose bytes arrived whole and were not the encoder's: (the coded copy's entry,
# the stripe's index, why).
StripeReport = Callable[[PlanEntry, int, str], None]


def restore_coded(
    entry: PlanEntry, dest: Path, token: str | None, report: StripeReport | None = None
) -> None:
    """Decode `entry`'s file into `dest` (written only once it matched); SourceError otherwise,
    nothing at `dest`. Each stripe read around because its bytes did not match is given to
    `report`, whether the file decoded from the others or not."""
    if entry.code is None or entry.crc32c is None:
        raise SourceError(f"the restore plan's coded copy of {entry.path!r} names no code")
    try:
        code = parse_code(entry.code)
    except InvalidCodeError as e:
        raise SourceError(f"the restore plan's coded copy of {entry.path!r}: {e}") from None
    by_index = {s.index: s for s in entry.stripes}

    def open_stripe(ref: StripeRef) -> BinaryIO:
        stripe = by_index[ref.index]
        one = PlanEntry(
            f"{entry.path} (stripe {stripe.index})",
            stripe.size,
            stripe.crc32c,
            entry.tier,
            "peer",
            stripe.node,
            stripe.url,
            url=stripe.url,
        )
        return io.BufferedReader(StripeStream(one, token))

    refs = [StripeRef(s.index, s.crc32c, s.url) for s in entry.stripes]
    try:
        decoded = restore_file(code, entry.size, entry.crc32c, refs, open_stripe, dest)
    # guard: coded-copy-short-of-k-falls-back
    except (NotEnoughStripesError, FileMismatchError) as e:
        if isinstance(e, NotEnoughStripesError):
            report_mismatched(entry, e.mismatched, report)
        raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {e}") from None
    report_mismatched(entry, decoded.mismatched, report)


def report_mismatched(
    entry: PlanEntry, mismatched: Mapping[int, str], report: StripeReport | None
) -> None:
    """Each stripe a read of `entry` left out because its bytes did not match, to `report` (a
    stripe that could not be read is not given: a holder down says nothing of its bytes)."""
    if report is None:
        return
    for index, why in sorted(mismatched.items()):
        report(entry, index, why)
