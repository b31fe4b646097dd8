"""A node's data endpoint: its local and peer tier files, read-only over HTTP, for the peers that
pull copies of them and for restores on other nodes.

Every request must carry a credential (`Authorization: Bearer ...`): the cluster's worker
credential (`Settings.data_token`), or an API token whose scopes cover the job (`read`, `admin`,
or `train:<prefix>` of the job). Only a verified copy that the catalog lists on this node's tier
is served, read through the tier store (no symlink followed below the root, the tier's read
bandwidth limit shared with every other read off the node); anything else is 404 whether or not
a file is there. One range per request (`Range: bytes=a-b`, `bytes=a-`) gives 206.
"""

from __future__ import annotations

import hmac
import io
import os
import re
import ssl
import threading
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

from tierpoint import auth, logs
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

    def do_GET(self) -> None:
        srv = self.server
        try:
            tier_name, ref = parse_data_path(self.path)
            who = authorize(srv.sessions, srv.settings, self.headers.get("Authorization"), ref.job)
            tier = next((t for t in srv.settings.tiers if t.name == tier_name), None)
            if tier is None or not tier.on_nodes:
                raise Denied(HTTPStatus.NOT_FOUND, f"no local or peer tier {tier_name!r}")
            with srv.sessions.begin() as s:
                size = peer_reads.served_size(s, srv.node, tier.name, ref.job, ref.step, ref.path)
            if size is None:
                raise Denied(HTTPStatus.NOT_FOUND, "no verified copy of it on this node")
            span = byte_range(self.headers.get("Range"), size)
        except (UnsafePath, ValueError) as exc:
            self.send_error(HTTPStatus.BAD_REQUEST, explain=str(exc))
            return
        except Denied as exc:
            self.send_error(exc.status, explain=str(exc))
            return
        self._send(open_store(tier, srv.node), ref, size, span, who)

    def _send(
        self, store: TierStore, ref: ShardRef, size: int, span: tuple[int, int] | None, who: str
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
        log.debug("served", path=ref.path, bytes=sent, to=who)


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
        super().__init__((host, port), _Handler)
        self.tls = settings.data_tls_cert is not None
        if settings.data_tls_cert is not None and settings.data_tls_key is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(settings.data_tls_cert, settings.data_tls_key)
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
