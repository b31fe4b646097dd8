"""The data endpoint's connection limits, with real sockets against a real endpoint on a real
catalog: a connection that never completes a request (silent, half a request, headers trickled a
byte at a time, a TLS handshake trickled the same way, a kept-alive connection gone quiet) is
closed at its deadline and not before; at the cap, a new connection takes the slot of the one that
has waited longest for a request, never of one being answered, and a reader with a credential
is served while the slots are full of connections that sent nothing. The deadlines are set small
through the settings; the waits below are hang guards, not timings."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tests.helpers.pki import make_pki
from tests.tierpoint.test_data_endpoint_reads import NODE, SECRET, verified
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve

GUARD = 30.0  # a hang guard: nothing below waits for it unless the endpoint misbehaves
HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5
BIG = 32 * 1024 * 1024  # more than the loopback's socket buffers hold in flight
AUTH = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    """The data endpoint serves files and reads the catalog: no Temporal, no S3."""
    return Settings.model_validate({**catalog_settings.model_dump(), "data_token": SECRET})


@contextlib.contextmanager
def endpoint(
    settings: Settings, sessions: sessionmaker[Session], **limits: object
) -> Iterator[DataServer]:
    srv = serve(settings.model_copy(update=limits), sessions, NODE, 0)
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def served_file(
    settings: Settings, sessions: sessionmaker[Session], size: int
) -> tuple[str, bytes]:
    """A verified copy on NODE's local tier: its path under the endpoint."""
    job = f"limits-{os.urandom(5).hex()}"
    data = os.urandom(size)
    cp = seed_checkpoint(
        settings, sessions, job, 1, [ShardSpec(NODE, "f.bin", data, crc_hex(data))]
    )
    verified(sessions, cp.checkpoint_id, ["f.bin"])
    return f"/v1/data/ssd/{job}/1/f.bin", data


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\n\r\n".encode()


def connect(srv: DataServer) -> socket.socket:
    host, port = srv.server_address[:2]
    sock = socket.create_connection((str(host), port), timeout=GUARD)
    return sock


def closed_by_server(sock: socket.socket, within: float = GUARD) -> bool:
    """Whether the endpoint ends the connection within `within` seconds (bytes it sent before,
    e.g. an answer, are read past)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True  # reset
    return True


def still_open(sock: socket.socket) -> bool:
    """Not closed by the endpoint (yet): no end of stream waiting to be read."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def read_answer(sock: socket.socket, got: bytes = b"") -> tuple[bytes, bytes]:
    """The rest of one answer on a kept-alive connection: (its head, its body)."""
    sock.settimeout(GUARD)
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        assert chunk, "closed before its answer"
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    parts = [body]
    left = length - len(body)
    while left > 0:
        chunk = sock.recv(min(left, 1 << 20))
        assert chunk, "closed before the end of its answer"
        parts.append(chunk)
        left -= len(chunk)
    return head, b"".join(parts)


def trickle(sock: socket.socket, data: bytes, every: float = 0.2) -> threading.Thread:
    """Send `data` a byte at a time, one every `every` seconds, until the endpoint closes."""

    def run() -> None:
        for i in range(len(data)):
            try:
                sock.send(data[i : i + 1])
            except OSError:
                return
            time.sleep(every)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def client_hello() -> bytes:
    """The first bytes a TLS client sends: what a slow TLS client would trickle."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def wait_until(what: str, ok: object) -> None:
    deadline = time.monotonic() + GUARD
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_connection_that_completes_no_request_is_closed_at_the_header_deadline(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    path, data = served_file(settings, sessions, 64 * 1024)
    limits = {"data_header_timeout": HEADER_TIMEOUT, "data_idle_timeout": IDLE_TIMEOUT}
    with endpoint(settings, sessions, **limits) as srv:
        opened = time.monotonic()
        silent = [connect(srv) for _ in range(3)]
        half = [connect(srv) for _ in range(2)]
        for sock in half:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode())
        slow = [connect(srv) for _ in range(2)]
        endless = b"GET " + path.encode() + b" HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
        for sock in slow:
            trickle(sock, endless)
        attackers = silent + half + slow
        # A reader with a credential is served meanwhile, whole.
        r = httpx.get(srv.url + path, headers=AUTH, timeout=GUARD)
        assert r.status_code == 200 and r.content == data
        for sock in attackers:
            assert closed_by_server(sock), "a connection without a complete request was held"
            # Not before the deadline: the clock ran from before the connect, so before the
            # endpoint's accept.
            assert time.monotonic() - opened >= HEADER_TIMEOUT
        wait_until("the endpoint still holds connections", lambda: len(srv.connections) == 0)
        for sock in attackers:
            sock.close()

        # A kept-alive connection gone quiet after its answer is closed after the idle timeout.
        kept = connect(srv)
        # The idle clock starts when the endpoint has sent the answer, which a loaded client
        # may finish reading later: only the request's sending is surely before it.
        asked = time.monotonic()
        kept.sendall(request(path))
        head, body = read_answer(kept)
        assert head.startswith(b"HTTP/1.1 200") and body == data
        assert closed_by_server(kept)
        assert time.monotonic() - asked >= IDLE_TIMEOUT
        kept.close()


def test_a_tls_handshake_trickled_a_byte_at_a_time_is_cut_at_the_header_deadline(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {
        "data_tls_cert": pki.server_cert,
        "data_tls_key": pki.server_key,
        "data_header_timeout": HEADER_TIMEOUT,
    }
    hello = client_hello()
    with endpoint(settings, sessions, **tls) as srv:
        opened = time.monotonic()
        sock = connect(srv)
        # Slow enough that the hello lasts far longer than the deadline.
        trickle(sock, hello, every=GUARD / len(hello) * 2)
        assert closed_by_server(sock), "a trickled handshake held its connection"
        assert time.monotonic() - opened >= HEADER_TIMEOUT
        sock.close()


def test_at_the_cap_a_new_connection_takes_the_slot_of_one_waiting_for_a_request(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    path, data = served_file(settings, sessions, 64 * 1024)
    # The deadlines are long: only the cap and its evictions let the reader in.
    limits = {"data_max_connections": 4, "data_header_timeout": 600.0, "data_idle_timeout": 600.0}
    with endpoint(settings, sessions, **limits) as srv:
        silent = [connect(srv) for _ in range(10)]
        wait_until(
            "the silent connections were not all admitted or cut",
            lambda: sum(not still_open(s) for s in silent) >= len(silent) - 4,
        )
        assert len(srv.connections) <= 4
        r = httpx.get(srv.url + path, headers={**AUTH, "Range": "bytes=10-99"}, timeout=GUARD)
        assert r.status_code == 206 and r.content == data[10:100]
        assert len(srv.connections) <= 4
        # The oldest waited longest: they were the ones cut.
        assert [still_open(s) for s in silent[:6]] == [False] * 6
        for sock in silent:
            sock.close()


def test_at_the_cap_with_every_slot_answering_a_new_connection_is_refused(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    path, data = served_file(settings, sessions, BIG)
    limits = {"data_max_connections": 2, "data_header_timeout": 600.0, "data_idle_timeout": 600.0}
    with endpoint(settings, sessions, **limits) as srv:
        readers = [connect(srv) for _ in range(2)]
        begun = []
        for sock in readers:
            sock.sendall(request(path))
            # The answer has begun (its headers are here) and cannot end: nobody reads it.
            begun.append(sock.recv(16))
            assert begun[-1].startswith(b"HTTP/1.1 200")
        late = connect(srv)
        assert closed_by_server(late), "a new connection took the slot of an answer under way"
        late.close()
        for sock in readers:
            assert still_open(sock)
        # One reader takes its answer; its connection then waits for a request, and the next
        # new connection takes its slot and is served.
        first = readers[0]
        _, body = read_answer(first, begun[0])
        assert body == data
        wait_until(
            "the answered connection never waited", lambda: srv.connections.waiting_count() == 1
        )
        r = httpx.get(srv.url + path, headers={**AUTH, "Range": "bytes=0-9"}, timeout=GUARD)
        assert r.status_code == 206 and r.content == data[:10]
        assert closed_by_server(first)
        for sock in readers:
            sock.close()
