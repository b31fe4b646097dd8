"""A copy on an S3 tier: the object (bucket, key) the catalog names, read only inside its tier's
own bucket and prefix, with the process's boto3 client for the tier's endpoint
(`tierpoint_client.s3`). It is one GET read front to back, or (for a reader that needs only some
items of a large file) only the byte ranges needed, each verified against its own crc32c."""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from tierpoint_client import s3
from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import chunk_buffer, crc32c_hex, update
from tierpoint_client.models import PlanEntry, TierInfo
from tierpoint_client.sources.base import Mismatch, Placement, Range, Sink
from tierpoint_client.sources.placing import stream_into
from tierpoint_client.transport import read_full

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Ranges closer than this are fetched in one GET: a request costs more than a MiB of transfer.
COALESCE_GAP = 1024 * 1024
RANGED_GETS_IN_FLIGHT = 4


class S3Source:
    def __init__(self, entry: PlanEntry, tier: TierInfo, client: S3Client) -> None:
        self.entry = entry
        self.tier = tier
        self.client = client

    def chunks(self, chunk_size: int) -> Generator[memoryview, None, None]:
        # One buffer per thread, filled in place from the socket: a `read(n)` (urllib3's
        # `readinto` too) would allocate and fault in a new chunk, then copy it.
        view = chunk_buffer(chunk_size)
        with self._stream() as readinto:
            while n := read_full(readinto, view):
                yield view[:n]

    def read_into(self, placement: Placement, copy: Sink | None) -> None:
        with self._stream() as readinto:
            stream_into(readinto, self.entry, placement, copy)

    def read_ranges(
        self, wanted: Sequence[Range], crcs: Mapping[Range, str]
    ) -> tuple[dict[Range, bytearray], int]:
        """Adjacent ranges are coalesced into one GET (`coalesce`), and up to
        RANGED_GETS_IN_FLIGHT GETs run at once."""
        spans = coalesce(wanted)

        def fetch(span: tuple[int, int]) -> bytes:
            start, end = span
            data = self._read_range(start, end - start)
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

    @contextlib.contextmanager
    def _stream(self) -> Iterator[Callable[[memoryview], int]]:
        """The object's bytes as one `readinto` (0 at the end), straight from the socket into
        the caller's memory; a body cut off among them is SourceError. A body read to its end
        goes back to botocore's pool; one left early (a longer copy, an error) is closed with its
        connection."""
        body = self._get()["Body"]
        try:
            yield s3.readinto_of(body)
        except BaseException as e:
            body.close()
            if isinstance(e, (http.client.HTTPException, ConnectionError, TimeoutError)):
                raise SourceError(f"{self.entry.location} cut off: {e!r}") from None
            raise
        # guard: restore-s3-connection-kept
        s3.release(body)

    def _read_range(self, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of the object, in one ranged GET (fewer when the object is
        shorter than the range)."""
        if length <= 0:
            return b""
        body = self._get(f"bytes={offset}-{offset + length - 1}")["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def _get(self, byte_range: str | None = None) -> Any:
        # The object as the API names it, never taken from `location`: that string is for people,
        # and a key may hold '?', '#' or '%' that a URL parser would cut or decode.
        entry, info, client = self.entry, self.tier, self.client
        bucket, key = entry.bucket, entry.key
        if not bucket or not key:
            raise SourceError(
                f"the restore plan gives no bucket and key for {entry.path!r} on tier "
                f"{entry.tier!r} (a server older than this client?)"
            )
        # Read only inside the tier's own bucket and prefix, whatever the plan says.
        if bucket != info.bucket or not key.startswith(info.prefix):
            raise SourceError(
                f"{entry.location} is outside tier {entry.tier!r} "
                f"(s3://{info.bucket}/{info.prefix})"
            )
        from botocore.exceptions import BotoCoreError  # there is a client: botocore is installed

        try:
            if byte_range is None:
                return client.get_object(Bucket=bucket, Key=key)
            return client.get_object(Bucket=bucket, Key=key, Range=byte_range)
        except client.exceptions.NoSuchKey:
            raise SourceError(f"restore source {entry.location} does not exist") from None
        except client.exceptions.ClientError as e:
            error = e.response.get("Error", {})
            if error.get("Code") == "InvalidRange":
                raise SourceError(f"{entry.location} is shorter than the range read") from None
            # Denied, throttled past the retries, a server error: this copy cannot be read now.
            raise SourceError(
                f"{entry.location}: S3 answered {error.get('Code')}: {error.get('Message')}"
            ) from None
        except BotoCoreError as e:  # no connection, timed out (after botocore's retries)
            raise SourceError(f"{entry.location}: {e}") from None


def coalesce(wanted: Sequence[Range], gap: int = COALESCE_GAP) -> list[tuple[int, int]]:
    """(start, end) spans covering the sorted ranges, joining those at most `gap` bytes apart."""
    spans: list[tuple[int, int]] = []
    for off, length in sorted(wanted):
        if spans and off - spans[-1][1] <= gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], off + length))
        else:
            spans.append((off, off + length))
    return spans
