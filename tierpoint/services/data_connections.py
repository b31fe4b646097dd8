"""The connections a node's data endpoint holds: how many at once, and how long each may take.

A connection costs a thread and a descriptor from its accept to its close, and it is accepted
before any credential can be read. So nobody may hold one without sending a request:

- a connection must complete its TLS handshake (over TLS), request line and headers within
  `data_header_timeout` of its accept, and a kept-alive one its next request's within as long of
  that request's first byte. One deadline for all of it, never reset by a byte arriving: a client
  that trickles its headers a byte at a time (slowloris) is cut off like a silent one;
- a kept-alive connection with no next request for `data_idle_timeout` is closed, and so is a
  response whose reader takes no byte for as long;
- at most `data_max_connections` are held at once. At the cap a new connection takes the slot of
  the one that has waited longest for a request (a kept-alive connection between requests, or
  one whose request has not arrived), never of one being answered: idle and half-open
  connections cannot keep a reader out. When every slot is answering a request the new
  connection is closed at once, and its client tries again or reads another copy.

A cut is a `shutdown` of the socket from the accepting thread: the connection's own thread,
blocked waiting for bytes, wakes to an end of stream, finishes and closes it.
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from tierpoint import metrics_worker


@dataclass
class _Held:
    sock: socket.socket
    # When it began to wait for a request; None while one is answered.
    waiting_since: float | None
    cut: bool = False


class Connections:
    """The endpoint's held connections, admitted against the cap (see the module's docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}

    def admit(self, sock: socket.socket) -> bool:
        """Whether to serve a connection just accepted; at the cap, the connection that has
        waited longest for a request is cut to make room, if there is one."""
        with self._lock:
            uncut = [h for h in self._held.values() if not h.cut]
            if len(uncut) >= self.limit:
                waiting = [h for h in uncut if h.waiting_since is not None]
                if not waiting:
                    metrics_worker.DATA_CONNECTIONS_CUT.labels("refused").inc()
                    return False
                oldest = min(waiting, key=lambda h: h.waiting_since or 0.0)
                oldest.cut = True
                _cut(oldest.sock)
                metrics_worker.DATA_CONNECTIONS_CUT.labels("evicted").inc()
            self._held[id(sock)] = _Held(sock, time.monotonic())
        return True

    def answering(self, sock: socket.socket) -> bool:
        """The connection's request has arrived: its slot is no longer up for eviction. False if
        it was cut meanwhile (its answer could not be sent)."""
        with self._lock:
            held = self._held.get(id(sock))
            if held is None or held.cut:
                return False
            held.waiting_since = None
            return True

    def waiting(self, sock: socket.socket) -> None:
        """The connection answered its request and waits for the next one."""
        with self._lock:
            held = self._held.get(id(sock))
            if held is not None and held.waiting_since is None:
                held.waiting_since = time.monotonic()

    def release(self, sock: socket.socket) -> None:
        """Forget the connection: called before it is closed, so a cut never reaches a
        descriptor that was closed and reused."""
        with self._lock:
            self._held.pop(id(sock), None)

    def __len__(self) -> int:
        with self._lock:
            return sum(not h.cut for h in self._held.values())

    def waiting_count(self) -> int:
        """Held connections waiting for a request: the slots a new connection may take."""
        with self._lock:
            return sum(not h.cut and h.waiting_since is not None for h in self._held.values())


def _cut(sock: socket.socket) -> None:
    # The plain socket's shutdown, even for a TLS socket: SSLSocket.shutdown would drop the TLS
    # state under the connection's own thread, which is still using it.
    with contextlib.suppress(OSError):  # already gone
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class DeadlineReader(io.RawIOBase):
    """A connection's incoming bytes, every read bounded by `deadline` (a time.monotonic()
    value; None: no deadline). Past it a read raises TimeoutError, which http.server answers by
    closing the connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                metrics_worker.DATA_CONNECTIONS_CUT.labels("header_timeout").inc()
                raise TimeoutError("the request did not arrive within the header deadline")
            self._sock.settimeout(left)
        try:
            return self._sock.recv_into(b)
        except TimeoutError:
            metrics_worker.DATA_CONNECTIONS_CUT.labels("header_timeout").inc()
            raise


def handshake(conn: ssl.SSLSocket, deadline: float) -> None:
    """The TLS handshake, done by `deadline` or TimeoutError: a socket timeout alone would
    restart at every byte the client sends."""
    conn.setblocking(False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            metrics_worker.DATA_CONNECTIONS_CUT.labels("header_timeout").inc()
            raise TimeoutError("the TLS handshake did not finish within the header deadline")
        try:
            conn.do_handshake()
            return
        except ssl.SSLWantReadError:
            select.select([conn], [], [], left)
        except ssl.SSLWantWriteError:
            select.select([], [conn], [], left)


def next_request(conn: socket.socket, idle: float) -> bool:
    """Whether the next request begins on a kept-alive connection within `idle` seconds (a cut
    connection wakes this at once, to an end of stream that ends it)."""
    # TLS may hold the next request's bytes already decrypted, where select cannot see them.
    if isinstance(conn, ssl.SSLSocket) and conn.pending():
        return True
    ready, _, _ = select.select([conn], [], [], idle)
    if not ready:
        metrics_worker.DATA_CONNECTIONS_CUT.labels("idle_timeout").inc()
    return bool(ready)


def wait_writable(sock: socket.socket, idle: float) -> None:
    """Block until the reader takes bytes again, TimeoutError after `idle` seconds without."""
    _, ready, _ = select.select([], [sock], [], idle)
    if not ready:
        metrics_worker.DATA_CONNECTIONS_CUT.labels("idle_timeout").inc()
        raise TimeoutError(f"the reader took no byte for {idle:g} s")
