"""A node's data endpoint, where a peer copy is read from its holder over HTTP(S): the process's
kept connections to each endpoint (`DataConnections`), the TLS it is reached with, and one GET of
a file (or one ranged GET per part read); every byte is verified by the caller against the
registered size and crc32c like any other source's."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlsplit

from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry
from tierpoint_client.transport import sized_readinto, tls_context

# A connection kept idle for longer is not reused: the endpoint closes its own after 30 s, and a
# request sent as it does so would fail.
IDLE_REUSE = 20.0
IDLE_PER_ENDPOINT = 16
_Endpoint = tuple[str, str, int | None]


class DataConnections:
    """Keep-alive connections to data endpoints, per endpoint, shared by a process's reads: a file
    read from a peer costs one request, not a TCP (and TLS) handshake and a new server thread.

    A connection goes back for reuse only once its response was read to the end (and the server
    did not ask to close it); a request on a reused connection that the server closed meanwhile
    is sent again once on a new one (a GET changes nothing)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._idle: dict[_Endpoint, list[tuple[float, http.client.HTTPConnection]]] = {}
        # A forked child (a DataLoader's worker) sending on its parent's sockets would interleave
        # its requests with the parent's on one connection: it starts with none, and a new lock
        # (a parent's thread may have held this one at the fork, and never releases it there).
        me = weakref.ref(self)

        def forget() -> None:
            if (conns := me()) is not None:
                conns._forget_parent()

        # guard: fork-forgets-peer-connections
        os.register_at_fork(after_in_child=forget)

    @contextlib.contextmanager
    def get(self, url: str, headers: Mapping[str, str]) -> Iterator[http.client.HTTPResponse]:
        """The response to a GET of `url` (http or https); raises OSError or HTTPException."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        endpoint: _Endpoint = (parsed.scheme, parsed.hostname, parsed.port)
        target = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        conn = self._take(endpoint)
        try:
            if conn is None:
                conn = self._new(endpoint)
                resp = _send(conn, target, headers)
            else:
                try:
                    resp = _send(conn, target, headers)
                except (http.client.RemoteDisconnected, ConnectionError):
                    conn.close()
                    conn = self._new(endpoint)
                    resp = _send(conn, target, headers)
            yield resp
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if resp.isclosed() and not resp.will_close:
            self._put(endpoint, conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for _, conn in conns:
                conn.close()

    def _new(self, endpoint: _Endpoint) -> http.client.HTTPConnection:
        scheme, host, port = endpoint
        if scheme == "https":
            return http.client.HTTPSConnection(
                host, port, timeout=self.timeout, context=data_tls_context()
            )
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _take(self, endpoint: _Endpoint) -> http.client.HTTPConnection | None:
        now = time.monotonic()
        stale: list[http.client.HTTPConnection] = []
        found = None
        with self._lock:
            conns = self._idle.get(endpoint, [])
            while conns:
                since, conn = conns.pop()
                if now - since < IDLE_REUSE:
                    found = conn
                    break
                stale.append(conn)
        for conn in stale:
            conn.close()
        return found

    def _put(self, endpoint: _Endpoint, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault(endpoint, [])
            if len(conns) < IDLE_PER_ENDPOINT:
                conns.append((time.monotonic(), conn))
                return
        conn.close()

    def _forget_parent(self) -> None:
        """In a forked child: forget the parent's sockets. Closing the child's copies of them
        (as collected) sends nothing: the parent's connections stay open and its own."""
        self._lock = threading.Lock()
        self._idle = {}


# The node worker's settings of the same names: a training job on a node is given them alike.
DATA_TLS_CA = "TIERPOINT_DATA_TLS_CA"
DATA_TLS_CLIENT_CERT = "TIERPOINT_DATA_TLS_CLIENT_CERT"
DATA_TLS_CLIENT_KEY = "TIERPOINT_DATA_TLS_CLIENT_KEY"


def data_tls_context() -> ssl.SSLContext:
    """How reads from https data endpoints are made: trusting the CA bundle in
    TIERPOINT_DATA_TLS_CA (else the system roots, or SSL_CERT_FILE's bundle), and presenting the
    client certificate in TIERPOINT_DATA_TLS_CLIENT_CERT (and _KEY) to an endpoint that requires
    one (mutual TLS). Made once per set of values: a certificate file replaced in place is read
    again by a new process."""
    env = os.environ
    return tls_context(
        env.get(DATA_TLS_CA) or None,
        env.get(DATA_TLS_CLIENT_CERT) or None,
        env.get(DATA_TLS_CLIENT_KEY) or None,
    )


def _send(
    conn: http.client.HTTPConnection, target: str, headers: Mapping[str, str]
) -> http.client.HTTPResponse:
    conn.request("GET", target, headers=dict(headers))
    return conn.getresponse()


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
