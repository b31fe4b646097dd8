"""A coded peer copy as `TierpointReader` reads it (a plan entry with `code` and `stripes`): any
k of its stripes read at once from their holders' data endpoints, data stripes first (with all k
of them the decode only joins their fragments), each stripe checked against its size and crc32c
and the decoded file against its registered size and crc32c (`erasure.stripes.decode`) before a
byte is placed. A stripe that cannot be read or does not match is read around: the decode starts
again from the next stripe instead. Fewer than k good is a SourceError, as for any copy that
cannot be read: the reader goes on to the next copy.

Each stripe is read by a thread of its own, a couple of fragments ahead of the decode (a bounded
queue), so a file costs the decoded file's buffer plus a few segments in flight, not k stripes
in memory; the verified buffer is then placed as a stream is (`placing.stream_into`)."""

from __future__ import annotations

import contextlib
import io
import queue
import threading
import warnings
from collections.abc import Callable, Generator
from http.client import HTTPException
from typing import BinaryIO

from tierpoint_client import peer
from tierpoint_client.erasure import (
    Code,
    FileMismatchError,
    InvalidCodeError,
    NotEnoughStripesError,
    StripeCorruptError,
    parse_code,
)
from tierpoint_client.erasure.fetch import StripeRef
from tierpoint_client.erasure.join import InMemory, Left, Target, join, joinable
from tierpoint_client.erasure.stripes import StripeSource, choose, decode, fragment_size
from tierpoint_client.erasure.stripes import segment_sizes as file_segments
from tierpoint_client.errors import SourceError, TierpointError
from tierpoint_client.models import PlanEntry, PlanStripe
from tierpoint_client.sources.base import Placement, Sink
from tierpoint_client.sources.coded import StripeReport, StripeStream, report_mismatched
from tierpoint_client.sources.coded_placed import NotPlaced, placed, stripe_entry
from tierpoint_client.sources.peer_endpoint import STRIPED_MIN
from tierpoint_client.sources.placing import stream_into
from tierpoint_client.transport import read_full

# Fragments a stripe's thread reads ahead of the decode.
AHEAD = 2
_END = object()


class _Stop(Exception):
    """The decode no longer wants this stripe."""


class _Unreadable(StripeCorruptError):
    """A stripe that could not be read (a holder down, a reply cut off): lost to this read, but
    nothing is said of the bytes its holder keeps, so it is not reported."""


class _StripeReader(io.RawIOBase):
    """One stripe's GET, read fragment by fragment on a thread of its own into a bounded queue;
    `read` hands them on. Anything that goes wrong reading it is a StripeCorruptError naming the
    stripe: the decode leaves it out."""

    def __init__(self, entry: PlanEntry, stripe: PlanStripe, token: str | None, code: Code):
        super().__init__()
        self.index = stripe.index
        self._where = stripe.url
        self._one = stripe_entry(entry, stripe)
        self._token = token
        self._fragments = [fragment_size(code, s) for s in file_segments(entry.size)]
        self._queue: queue.Queue[object] = queue.Queue(AHEAD)
        self._stop = threading.Event()
        self._held = memoryview(b"")
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="tierpoint-stripe", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> None:
        while True:
            if self._stop.is_set():
                raise _Stop
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            with peer.stream(self._one, self._token) as readinto:
                for n in self._fragments:
                    view = memoryview(bytearray(n))
                    got = read_full(readinto, view)
                    self._put(view[:got])
                    if got < n:
                        break
                else:
                    # One byte more, to see a stripe longer than its size.
                    extra = memoryview(bytearray(1))
                    if read_full(readinto, extra):
                        self._put(extra)
            self._put(_END)
        except _Stop:
            return
        # guard: coded-read-error-is-a-lost-stripe
        except (OSError, HTTPException, TierpointError) as e:
            # Cannot be read (a holder down, a stripe it no longer serves, a reply cut off):
            # this stripe is lost, the decode reads another.
            with contextlib.suppress(_Stop):
                self._put(_Unreadable(self.index, f"from {self._where}: {e}"))
        except BaseException as e:  # anything else ends the read, never hangs the decode
            with contextlib.suppress(_Stop):
                self._put(e)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if not self._held and not self._ended:
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            if item is _END:
                self._ended = True
            else:
                assert isinstance(item, memoryview)
                self._held = item
        n = len(self._held) if size is None or size < 0 else min(size, len(self._held))
        out, self._held = self._held[:n], self._held[n:]
        return bytes(out) if len(out) < 4096 else out  # type: ignore[return-value]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        super().close()


class _Into(io.RawIOBase):
    """Writes appended to one buffer (the decoded file)."""

    def __init__(self, buffer: bytearray) -> None:
        super().__init__()
        self._view = memoryview(buffer)
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        n = len(b)
        if self._pos + n > len(self._view):
            raise FileMismatchError(f"decoded more than the file's {len(self._view)} bytes")
        self._view[self._pos : self._pos + n] = b
        self._pos += n
        return n


class CodedSource:
    """`report`: told of each stripe read around because its bytes did not match, whether the
    file then decoded from the others or not (`coded.report_mismatched`)."""

    def __init__(
        self, entry: PlanEntry, token: str | None, report: StripeReport | None = None
    ) -> None:
        self.entry = entry
        self.token = token
        self.report = report

    def chunks(self, chunk_size: int) -> Generator[memoryview, None, None]:
        data = self.decoded()
        for start in range(0, len(data), chunk_size):
            yield data[start : start + chunk_size]

    def read_into(self, placement: Placement, copy: Sink | None) -> None:
        code = self._code()
        left: dict[int, Left] = {}
        if copy is None and self.entry.size >= STRIPED_MIN:
            # Straight into place where the placement can be made from the data stripes: below
            # STRIPED_MIN the placement's head reads (a GET each) cost more than the buffer.
            try:
                target = placed(self.entry, code, self._data(code), self.token, placement)
            except NotPlaced:
                target = None
            if target is not None:
                joined = self._joined(code, target)
                if joined is None:
                    return
                left = joined
        data = self._decoded(code, left)
        stream_into(_reader(data), self.entry, placement, copy)

    def _code(self) -> Code:
        entry = self.entry
        if entry.code is None or entry.crc32c is None:
            raise SourceError(f"the coded copy of {entry.path!r} names no code or crc32c")
        try:
            return parse_code(entry.code)
        except InvalidCodeError as e:
            raise SourceError(f"the coded copy of {entry.path!r}: {e}") from None

    def _data(self, code: Code) -> dict[int, PlanStripe]:
        return {s.index: s for s in self.entry.stripes if s.index < code.k}

    def _joined(self, code: Code, target: Target) -> dict[int, Left] | None:
        """The file joined from its k data stripes into `target` (`erasure.join`): None when
        every stripe and the file matched; else the data stripes left out, why, and whether they
        did not match ({}: not every data stripe is listed)."""
        entry = self.entry
        assert entry.crc32c is not None
        data = self._data(code)
        if len(data) < code.k or not joinable(code):
            return {}
        refs = [StripeRef(s.index, s.crc32c, s.url) for s in data.values()]

        def open_stripe(ref: StripeRef) -> BinaryIO:
            return StripeStream(stripe_entry(entry, data[ref.index]), self.token)  # type: ignore[return-value]

        try:
            left = join(code, entry.size, entry.crc32c, refs, open_stripe, target)
        except FileMismatchError as e:
            raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {e}") from None
        return left or None

    def decoded(self) -> memoryview:
        """The file, decoded from k good stripes and checked against its registered size and
        crc32c; SourceError when fewer than k are good or the set does not give the file."""
        return self._decoded(self._code(), {})

    def _decoded(self, code: Code, left: dict[int, Left]) -> memoryview:
        """The file in a buffer of its own: joined from the data stripes unless `left` names
        data stripes left out already, else decoded from k good stripes with parity. The
        stripes left out because they did not match go to `report` once the read is done."""
        entry = self.entry
        assert entry.crc32c is not None
        buffer = bytearray(entry.size)
        if not left:
            joined = self._joined(code, InMemory(memoryview(buffer)))
            if joined is None:
                return memoryview(buffer)
            left = joined
        # guard: load-reports-only-a-mismatched-stripe
        mismatched = {i: stripe.why for i, stripe in left.items() if stripe.mismatch}
        try:
            return self._around(
                code, buffer, {i: stripe.why for i, stripe in left.items()}, mismatched
            )
        finally:
            # guard: load-reports-a-stripe-it-read-around
            report_mismatched(entry, mismatched, self.report)

    def _around(
        self, code: Code, buffer: bytearray, rejected: dict[int, str], mismatched: dict[int, str]
    ) -> memoryview:
        """Decoded into `buffer` from k stripes not `rejected`, parity among them; each stripe
        then found bad is added to `rejected` (and to `mismatched` unless it could not be read)
        and the decode starts again."""
        entry = self.entry
        assert entry.crc32c is not None
        by_index = {s.index: s for s in entry.stripes}
        for why in rejected.values():
            warnings.warn(
                f"tierpoint: {entry.path} on tier {entry.tier}: {why}; reading another stripe",
                stacklevel=3,
            )
        while True:
            good = [i for i in by_index if i not in rejected]
            if len(good) < code.k:
                short = NotEnoughStripesError(code, rejected, len(by_index))
                raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {short}")
            used = choose(code, good)
            try:
                with contextlib.ExitStack() as stack:
                    sources = {
                        i: StripeSource(
                            i,
                            stack.enter_context(
                                _StripeReader(entry, by_index[i], self.token, code)
                            ),  # type: ignore[arg-type]
                            by_index[i].crc32c,
                        )
                        for i in used
                    }
                    decode(code, entry.size, entry.crc32c, sources, _Into(buffer))  # type: ignore[arg-type]
            # guard: coded-read-reads-around-a-bad-stripe
            except StripeCorruptError as e:
                rejected[e.index] = str(e)
                # guard: load-reports-no-stripe-it-could-not-read
                if not isinstance(e, _Unreadable):
                    mismatched[e.index] = str(e)
                warnings.warn(
                    f"tierpoint: {entry.path} on tier {entry.tier}: {e}; reading another stripe",
                    stacklevel=2,
                )
                continue
            except FileMismatchError as e:
                raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {e}") from None
            except Exception as e:  # pyeclib refused fragments whose stripes all matched
                raise SourceError(f"{entry.tier} coded copy of {entry.path!r}: {e!r}") from None
            return memoryview(buffer)


def _reader(data: memoryview) -> Callable[[memoryview], int]:
    """A `readinto` of `data`, front to back, without a copy of it."""
    pos = 0

    def readinto(view: memoryview) -> int:
        nonlocal pos
        n = min(len(view), len(data) - pos)
        view[:n] = data[pos : pos + n]
        pos += n
        return n

    return readinto
