"""Reading a peer copy: a file from its holder's data endpoint over HTTP(S), one GET on the
process's kept connections (`transport.DataConnections`), every byte verified by the caller
against the registered size and crc32c like any other source's."""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import chunk_buffer
from tierpoint_client.models import PlanEntry
from tierpoint_client.transport import DataConnections

# A peer's data endpoint that sends nothing for this long fails the read (the next copy is tried).
PEER_TIMEOUT = 60.0

# The process's connections to data endpoints, kept open from one file to the next.
PEERS = DataConnections(PEER_TIMEOUT)


def _checked(entry: PlanEntry, token: str | None) -> dict[str, str]:
    if not entry.url:
        raise SourceError(f"the restore plan gives no URL for the peer copy of {entry.path!r}")
    url = urlsplit(entry.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SourceError(f"peer copy URL {entry.url!r} is not http(s)")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _refused(entry: PlanEntry, resp: http.client.HTTPResponse) -> SourceError:
    why = resp.read(512).decode("utf-8", "replace").strip()
    return SourceError(f"peer copy {entry.url}: HTTP {resp.status} {why}")


def read_full(body: object, view: memoryview) -> int:
    """Fill `view` from a response body; fewer bytes only at its end (a socket read returns
    whatever has arrived, often much less than asked for)."""
    readinto = getattr(body, "readinto", None)  # botocore's StreamingBody has it since 1.36
    read = getattr(body, "read")  # noqa: B009 - every body has it; readinto is optional
    got = 0
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = read(len(view) - got)
            n = len(data)
            view[got : got + n] = data
        if not n:
            break
        got += n
    return got


def peer_chunks(entry: PlanEntry, token: str | None, chunk_size: int) -> Iterator[memoryview]:
    """The file from its holder's data endpoint: one plain GET, the bytes verified by the
    caller like any other source's."""
    headers = _checked(entry, token)
    view = chunk_buffer(chunk_size)
    try:
        with PEERS.get(entry.url or "", headers) as resp:
            if resp.status != 200:
                raise _refused(entry, resp)
            while True:
                try:
                    n = read_full(resp, view)
                except http.client.HTTPException as e:
                    raise SourceError(f"peer copy {entry.url} cut off: {e!r}") from None
                if not n:
                    return
                yield view[:n]
    except (OSError, http.client.HTTPException) as e:
        raise SourceError(f"peer copy {entry.url}: {e!r}") from None


@contextlib.contextmanager
def stream(entry: PlanEntry, token: str | None) -> Iterator[Callable[[memoryview], int]]:
    """The file's bytes as a `readinto` of its one GET (0 at its end); a failure to read is
    SourceError."""
    headers = _checked(entry, token)
    try:
        with PEERS.get(entry.url or "", headers) as resp:
            if resp.status != 200:
                raise _refused(entry, resp)
            yield resp.readinto
    except (OSError, http.client.HTTPException) as e:
        raise SourceError(f"peer copy {entry.url}: {e!r}") from None
