"""Reading one copy of a file, wherever it is: a POSIX path (a local or shared tier), an S3 object
(by bucket and key, inside its tier's bucket and prefix), or a peer's data endpoint. A copy that
cannot be read raises SourceError, whatever the reason: the caller goes on to the next copy."""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tierpoint_client import peer, s3
from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import chunk_buffer
from tierpoint_client.models import PlanEntry, TierInfo
from tierpoint_client.transport import read_full

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def _posix_chunks(location: str, chunk_size: int) -> Generator[memoryview, None, None]:
    buf = bytearray(chunk_size)
    view = memoryview(buf)
    try:
        f = open(location, "rb", buffering=0)  # noqa: SIM115 - closed in finally of a generator
    except FileNotFoundError:
        raise SourceError(f"restore source {location} does not exist") from None
    except OSError as e:
        raise SourceError(f"restore source {location} cannot be opened: {e}") from None
    try:
        while True:
            try:
                n = f.readinto(view)
            except OSError as e:
                raise SourceError(f"restore source {location} cannot be read: {e}") from None
            if not n:
                return
            yield view[:n]
    finally:
        f.close()


class Sources:
    """Opens plan entries for reading; one boto3 client per S3 tier, made up front. A peer copy
    is read from its holder's data endpoint with `token` (the API token: the endpoint accepts a
    token whose scopes cover the job)."""

    def __init__(
        self, tiers: dict[str, TierInfo], entries: Sequence[PlanEntry], token: str | None = None
    ) -> None:
        self._s3: dict[str, S3Client] = {}
        self._token = token
        self._tiers = tiers
        self._lock = threading.Lock()
        for tier in sorted({e.tier for e in entries if e.kind == "s3"}):
            self._client(tier)

    def _client(self, tier: str) -> S3Client:
        """The tier's boto3 client, made on first use (a fallback source may name a new tier)."""
        with self._lock:
            client = self._s3.get(tier)
            if client is None:
                info = self._tiers.get(tier)
                if info is None:
                    raise SourceError(
                        f"the restore plan names tier {tier!r}, which GET /v1/tiers lacks"
                    )
                client = self._s3[tier] = s3.client_for(info)
            return client

    def chunks(self, entry: PlanEntry, chunk_size: int) -> Generator[memoryview, None, None]:
        if entry.kind in ("local", "shared"):
            return _posix_chunks(entry.location, chunk_size)
        if entry.kind in ("s3", "peer"):
            return self._streamed_chunks(entry, chunk_size)
        raise SourceError(
            f"tier {entry.tier!r} has kind {entry.kind!r}, which this client cannot read"
        )

    @contextlib.contextmanager
    def stream(self, entry: PlanEntry) -> Iterator[Callable[[memoryview], int]]:
        """An S3 or peer copy's bytes as one `readinto` (0 at the end), straight from the
        socket into the caller's memory; a failure to read, a body cut off among them, is
        SourceError. An S3 body read to its end goes back to botocore's pool; one left early
        (a longer copy, an error) is closed with its connection."""
        if entry.kind == "peer":
            with peer.stream(entry, self._token) as readinto:
                yield readinto
            return
        if entry.kind != "s3":
            raise SourceError(f"streamed reads are for S3 and peer tiers, not {entry.kind!r}")
        body = self._get(entry)["Body"]
        try:
            yield s3.readinto_of(body)
        except BaseException as e:
            body.close()
            if isinstance(e, (http.client.HTTPException, ConnectionError, TimeoutError)):
                raise SourceError(f"{entry.location} cut off: {e!r}") from None
            raise
        # guard: restore-s3-connection-kept
        s3.release(body)

    def read_range(self, entry: PlanEntry, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of an S3 entry's object, in one ranged GET (fewer when the
        object is shorter than the range)."""
        if entry.kind != "s3":
            raise SourceError(f"ranged reads are for S3 tiers; {entry.tier!r} is {entry.kind!r}")
        if length <= 0:
            return b""
        resp = self._get(entry, f"bytes={offset}-{offset + length - 1}")
        body = resp["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def _get(self, entry: PlanEntry, byte_range: str | None = None) -> Any:
        # The object as the API names it, never taken from `location`: that string is for people,
        # and a key may hold '?', '#' or '%' that a URL parser would cut or decode.
        bucket, key = entry.bucket, entry.key
        if not bucket or not key:
            raise SourceError(
                f"the restore plan gives no bucket and key for {entry.path!r} on tier "
                f"{entry.tier!r} (a server older than this client?)"
            )
        info = self._tiers[entry.tier]
        # Read only inside the tier's own bucket and prefix, whatever the plan says.
        if bucket != info.bucket or not key.startswith(info.prefix):
            raise SourceError(
                f"{entry.location} is outside tier {entry.tier!r} "
                f"(s3://{info.bucket}/{info.prefix})"
            )
        client = self._client(entry.tier)
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

    def _streamed_chunks(
        self, entry: PlanEntry, chunk_size: int
    ) -> Generator[memoryview, None, None]:
        # One buffer per thread, filled in place from the socket: a `read(n)` (urllib3's
        # `readinto` too) would allocate and fault in a new chunk, then copy it.
        view = chunk_buffer(chunk_size)
        with self.stream(entry) as readinto:
            while n := read_full(readinto, view):
                yield view[:n]
