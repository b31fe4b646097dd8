"""A coded peer copy (a plan entry with `code` and `stripes`): the file decoded from any k of its
stripes, each read from its holder's data endpoint with the API token and checked against its
size and crc32c as it lands, the file checked against its registered size and crc32c before it
is published (`erasure.fetch.restore_file`). Fewer than k good stripes, or a decode that does
not match, is a SourceError: this copy cannot be read, the restore goes on to the next tier."""

from __future__ import annotations

import contextlib
import io
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


class _StripeStream(io.RawIOBase):
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


def restore_coded(entry: PlanEntry, dest: Path, token: str | None) -> None:
    """Decode `entry`'s file into `dest` (written only once it matched); SourceError otherwise,
    nothing at `dest`."""
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
        return io.BufferedReader(_StripeStream(one, token))

    refs = [StripeRef(s.index, s.crc32c, s.url) for s in entry.stripes]
    try:
        restore_file(code, entry.size, entry.crc32c, refs, open_stripe, dest)
    # guard: coded-copy-short-of-k-falls-back
    except (NotEnoughStripesError, FileMismatchError) as e:
        raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {e}") from None
