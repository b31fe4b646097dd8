"""A node's data endpoint: its local and peer tier files, read-only over HTTP, for the peers that
pull copies of them and for restores on other nodes.

Every request must carry a credential (`Authorization: Bearer ...`): the cluster's worker
credential (`Settings.data_token`), or an API token whose scopes cover the job (`read`, `admin`,
or `train:<prefix>` of the job). Only a verified copy that the catalog lists on this node's tier
is served, read through the tier store (no symlink followed below the root, the tier's read
bandwidth limit shared with every other read off the node); anything else is 404 whether or not
a file is there. One range per request (`Range: bytes=a-b`, `bytes=a-`) gives 206.

Over TLS (`data_tls_cert`), with `data_tls_client_auth` the endpoint also requires a client
certificate of `data_tls_ca` (mutual TLS): a connection without one is refused at the handshake,
before its request is read, and counted by reason; the credential applies on top.

A restore reads every file of a checkpoint in a burst, over keep-alive connections: the catalog
is asked once per checkpoint for the verified copies this node holds of it, and that listing
answers the checkpoint's other requests for `LISTING_TTL` seconds. A path not in it is looked
up again (a copy verified since is served at once), never guessed; a copy that stopped being
verified may still be served for at most `LISTING_TTL` (its bytes are the registered ones, and
the reader checks them against the registered crc32c). The credential is checked on every
request.
"""

from __future__ import annotations

import hmac
import io
import os
import re
import select
import ssl
import threading
import time
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

from tierpoint import auth, logs, metrics_worker
from tierpoint.catalog import peer_reads, tokens_repo
from tierpoint.catalog.engine import Sessions
from tierpoint.config import Settings
from tierpoint.errors import InvalidToken, UnsafePath
from tierpoint.storage.base import ShardRef, TierStore
from tierpoint.storage.peer_http import parse_data_path
from tierpoint.storage.posix.page_cache import drop_cache
from tierpoint.storage.registry import open_store
from tierpoint.storage.throttle import TokenBucket

log = logs.get(__name__)

CHUNK = 8 * 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
# How long a checkpoint's listing of served files answers for it (see the module's docstring).
LISTING_TTL = 1.0
# Checkpoints whose listing is kept at once; beyond it, the oldest is dropped.
LISTINGS = 64
# A keep-alive connection with no request for this long is closed, freeing its thread: a client
# keeps its connection for the next file, and one that forgets it must not hold a thread.
IDLE_TIMEOUT = 30.0


class Denied(Exception):
    def __init__(self, status: HTTPStatus, why: str) -> None:
        super().__init__(why)
        self.status = status


def authorize(sessions: Sessions, settings: Settings, header: str | None, job: str) -> str:
    """Who the request acts as, or Denied: 401 without a valid credential, 403 with one whose
    scopes do not cover `job`."""
    scheme, _, secret = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not secret:
        raise Denied(HTTPStatus.UNAUTHORIZED, "a bearer credential is required")
    worker = settings.data_token
    if worker is not None and hmac.compare_digest(
        secret.encode(), worker.get_secret_value().encode()
    ):
        return "worker"
    with sessions.begin() as s:
        record = tokens_repo.token_by_digest(s, auth.digest(secret))
    if record is None:
        raise Denied(HTTPStatus.UNAUTHORIZED, "unknown credential")
    try:
        who = auth.principal_of(record, datetime.now(UTC))
    except InvalidToken as exc:
        raise Denied(HTTPStatus.UNAUTHORIZED, str(exc)) from None
    if not (who.has(auth.Scope.READ) or who.trains(job)):
        raise Denied(HTTPStatus.FORBIDDEN, f"token {who.name!r} may not read job {job!r}")
    return who.name


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a single `bytes=` range, None for the whole file; Denied(416) for one
    that does not fit."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if m is None:
        raise Denied(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "one bytes=a-b range only")
    start = int(m.group(1))
    end = int(m.group(2)) + 1 if m.group(2) else size
    end = min(end, size)
    if start >= size or end <= start:
        if start == size == 0:
            return 0, 0
        raise Denied(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, f"the file has {size} bytes")
    return start, end


class Listings:
    """The verified copies `node` holds of recently read checkpoints, per (tier, job, step)."""

    def __init__(self, sessions: Sessions, node: str, ttl: float = LISTING_TTL) -> None:
        self.sessions, self.node, self.ttl = sessions, node, ttl
        self._lock = threading.Lock()
        self._listed: dict[tuple[str, str, int], tuple[float, dict[str, int]]] = {}
        self._loading: dict[tuple[str, str, int], threading.Lock] = {}

    def size(self, tier: str, job: str, step: int, path: str) -> int | None:
        """The size of the file if this node serves it (a verified copy on `tier`), else None."""
        key = (tier, job, step)
        found = self._cached(key, path)
        if found is not None:
            return found
        # One query per checkpoint at a time: the first files of a restore are asked for at
        # once, and the others wait for its listing rather than each making their own.
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            try:
                found = self._cached(key, path)
                if found is not None:
                    return found
                listed_at = time.monotonic()
                with self.sessions.begin() as s:
                    listed = peer_reads.served_sizes(s, self.node, tier, job, step)
                with self._lock:
                    self._listed.pop(key, None)
                    while len(self._listed) >= LISTINGS:
                        del self._listed[next(iter(self._listed))]
                    self._listed[key] = (listed_at, listed)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
        return listed.get(path)

    def _cached(self, key: tuple[str, str, int], path: str) -> int | None:
        with self._lock:
            hit = self._listed.get(key)
        if hit is None or time.monotonic() - hit[0] >= self.ttl:
            return None
        return hit[1].get(path)


class _Handler(BaseHTTPRequestHandler):
    server: DataServer
    protocol_version = "HTTP/1.1"
    # The headers go out in one small segment before the body: with Nagle's algorithm the body's
    # first segment would wait for the reader's delayed ACK of them (~40 ms per file).
    disable_nagle_algorithm = True
    # No server banner beyond the protocol's.
    server_version = "tierpoint"
    sys_version = ""
    error_content_type = "text/plain"
    error_message_format = "%(code)d %(message)s: %(explain)s\n"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("data endpoint", request=format % args)

    def handle(self) -> None:
        """The connection's requests until it closes or stays idle for IDLE_TIMEOUT."""
        self.close_connection = True
        if isinstance(self.connection, ssl.SSLSocket) and not self._handshake(self.connection):
            return
        self.handle_one_request()
        while not self.close_connection:
            # TLS may hold the next request's bytes already decrypted, where select cannot see.
            tls_pending = isinstance(self.connection, ssl.SSLSocket) and self.connection.pending()
            if not tls_pending:
                ready, _, _ = select.select([self.connection], [], [], IDLE_TIMEOUT)
                if not ready:
                    return
            self.handle_one_request()

    def _handshake(self, conn: ssl.SSLSocket) -> bool:
        """The TLS handshake, before any request is read: with client authentication on, a
        client without a certificate the CA signed gets no further. A client silent for
        IDLE_TIMEOUT is dropped rather than holding its thread."""
        conn.settimeout(IDLE_TIMEOUT)
        try:
            conn.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            why = refusal(exc)
            metrics_worker.DATA_HANDSHAKES_REFUSED.labels(why).inc()
            log.warning(
                "data endpoint refused a TLS handshake", peer=self.client_address[0], why=why
            )
            return False
        finally:
            conn.settimeout(None)
        return True

    def do_GET(self) -> None:
        srv = self.server
        try:
            tier_name, ref = parse_data_path(self.path)
            who = authorize(srv.sessions, srv.settings, self.headers.get("Authorization"), ref.job)
            tier = next((t for t in srv.settings.tiers if t.name == tier_name), None)
            if tier is None or not tier.on_nodes:
                raise Denied(HTTPStatus.NOT_FOUND, f"no local or peer tier {tier_name!r}")
            size = srv.listings.size(tier.name, ref.job, ref.step, ref.path)
            if size is None:
                raise Denied(HTTPStatus.NOT_FOUND, "no verified copy of it on this node")
            span = byte_range(self.headers.get("Range"), size)
        except (UnsafePath, ValueError) as exc:
            self.send_error(HTTPStatus.BAD_REQUEST, explain=str(exc))
            return
        except Denied as exc:
            self.send_error(exc.status, explain=str(exc))
            return
        self._send(tier.name, open_store(tier, srv.node), ref, size, span, who)

    def _send(
        self,
        tier: str,
        store: TierStore,
        ref: ShardRef,
        size: int,
        span: tuple[int, int] | None,
        who: str,
    ) -> None:
        start, end = span if span is not None else (0, size)
        try:
            reader = cast(io.RawIOBase, store.open_read(ref, start))
        except (FileNotFoundError, UnsafePath) as exc:
            self.send_error(HTTPStatus.NOT_FOUND, explain=f"not readable here: {exc}")
            return
        with reader:
            self.send_response(HTTPStatus.PARTIAL_CONTENT if span is not None else HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            if span is not None:
                self.send_header("Content-Range", f"bytes {start}-{max(end - 1, start)}/{size}")
            self.end_headers()
            limiter = getattr(store, "limiter", None)
            if isinstance(self.connection, ssl.SSLSocket):
                sent = _send_tls(self.connection, reader.fileno(), start, end, limiter)
            else:
                sent = _send_file(self.connection.fileno(), reader.fileno(), start, end, limiter)
            if sent < end - start:
                # Shorter than the catalog says: cut the connection, the reader sees a short
                # body and never takes it for the file.
                self.close_connection = True
            drop_cache(reader.fileno(), start, sent)
        metrics_worker.DATA_BYTES_SERVED.labels(tier).inc(sent)
        log.debug("served", path=ref.path, bytes=sent, to=who)


def refusal(exc: OSError) -> str:
    """A refused handshake's reason, as few distinct words as OpenSSL has reasons."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason or "certificate verify failed")
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or "tls error").lower().replace("_", " ")
    return "timeout" if isinstance(exc, TimeoutError) else "connection lost"


def _send_file(sock: int, fd: int, start: int, end: int, limiter: TokenBucket | None) -> int:
    """Bytes [start, end) of `fd` to the socket with sendfile (page cache to socket, no copy
    through Python), a chunk at a time through the tier's read limiter; how many were sent."""
    pos = start
    while pos < end:
        n = os.sendfile(sock, fd, pos, min(CHUNK, end - pos))
        if not n:
            break
        if limiter is not None:
            limiter.consume(n)
        pos += n
    return pos - start


def _send_tls(
    conn: ssl.SSLSocket, fd: int, start: int, end: int, limiter: TokenBucket | None
) -> int:
    """As `_send_file` over TLS, which sendfile cannot encrypt: read, then encrypt and send."""
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(CHUNK, end - pos), pos)
        if not chunk:
            break
        conn.sendall(chunk)
        if limiter is not None:
            limiter.consume(len(chunk))
        pos += len(chunk)
    return pos - start


class DataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, settings: Settings, sessions: Sessions, node: str, host: str, port: int):
        self.settings, self.sessions, self.node = settings, sessions, node
        self.listings = Listings(sessions, node)
        super().__init__((host, port), _Handler)
        self.tls = settings.data_tls_cert is not None
        if settings.data_tls_cert is not None and settings.data_tls_key is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(settings.data_tls_cert, settings.data_tls_key)
            if settings.data_tls_client_auth:
                # Mutual TLS: OpenSSL checks the chain to the CA, the dates and that the
                # certificate may authenticate a client (its extended key usage, if any).
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cafile=settings.data_tls_ca)
            # The handshake runs in the request's thread (on its first read), not in the thread
            # that accepts: a slow or silent client holds up no other.
            self.socket = ctx.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    @property
    def url(self) -> str:
        if self.settings.data_url:
            return self.settings.data_url
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{name if ':' not in name else f'[{name}]'}:{port}"


def serve(settings: Settings, sessions: Sessions, node: str, port: int) -> DataServer:
    """Start serving `node`'s files in a background thread; stop with `shutdown()`."""
    server = DataServer(settings, sessions, node, settings.data_host, port)
    threading.Thread(target=server.serve_forever, name=f"data-{node}", daemon=True).start()
    return server
