"""Reading a peer copy: a file from its holder's data endpoint over HTTP(S), one GET (or one
ranged GET per part read) on the process's kept connections (`transport.DataConnections`), every
byte verified by the caller against the registered size and crc32c like any other source's."""

from __future__ import annotations

import contextlib
import http.client
import re
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry
from tierpoint_client.transport import DataConnections, sized_readinto

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


@contextlib.contextmanager
def stream(entry: PlanEntry, token: str | None) -> Iterator[Callable[[memoryview], int]]:
    """The file's bytes as a `readinto` of its one GET, straight from the socket into the
    caller's memory (0 at its end); a failure to read, a body cut off among them, is
    SourceError."""
    headers = _checked(entry, token)
    try:
        with PEERS.get(entry.url or "", headers) as resp:
            if resp.status != 200:
                raise _refused(entry, resp)
            yield sized_readinto(resp)
    except (OSError, http.client.HTTPException) as e:
        raise SourceError(f"peer copy {entry.url}: {e!r}") from None


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


@contextlib.contextmanager
def ranged(
    entry: PlanEntry, token: str | None, offset: int, length: int
) -> Iterator[tuple[Callable[[memoryview], int], int]]:
    """Bytes [offset, offset + length) of the file (fewer at its end) as the `readinto` of one
    ranged GET, and the file's size as the endpoint gives it. A reply that is not a 206 starting
    at `offset` is refused, a failure to read (a body cut off among them) is SourceError."""
    if length <= 0 or offset < 0:
        raise ValueError(f"a ranged read of {length} bytes at {offset}")
    headers = {**_checked(entry, token), "Range": f"bytes={offset}-{offset + length - 1}"}
    try:
        with PEERS.get(entry.url or "", headers) as resp:
            if resp.status != 206:
                raise _refused(entry, resp)
            got = _CONTENT_RANGE.match(resp.getheader("Content-Range") or "")
            if got is None or int(got[1]) != offset:
                raise SourceError(
                    f"peer copy {entry.url}: asked bytes from {offset}, sent "
                    f"{resp.getheader('Content-Range')!r}"
                )
            yield sized_readinto(resp), int(got[3])
    except (OSError, http.client.HTTPException) as e:
        raise SourceError(f"peer copy {entry.url}: {e!r}") from None
