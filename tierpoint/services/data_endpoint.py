"""A node's data endpoint: its local and peer tier files, read-only over HTTP, for the peers that
pull copies of them and for restores on other nodes.

Every request must carry a credential (`Authorization: Bearer ...`): the cluster's worker
credential (`Settings.data_token`), or an API token whose scopes cover the job (`read`, `admin`,
or `train:<prefix>` of the job). It is checked first: without a valid one a request is 401
whatever its path (`data_access.py`). Only a verified copy that the catalog lists on this node's
tier is served, read through the tier store (no symlink followed below the root, the tier's read
bandwidth limit shared with every other read off the node); anything else is 404 whether or not
a file is there. A coded tier's stripe (`<tier>~<index>`, `peer_http.stripe_url`) is served by
the shard's node from its staging area while the catalog places it there for its holder (not
lost, expiring or expired), and by its holder from its root of the tier while the catalog has it
verified there (a restore's read), with the same credential, limits and refusals.
One range per request (`Range: bytes=a-b`, `bytes=a-`) gives 206. Refusals are
RFC 9457 problem+json documents with a stable `code`.

The endpoint never promises bytes it does not have: a file that is not its registered size when
it is opened is not served (404 `copy_damaged`), and one that ends early while it is sent cuts
the connection, so a reader sees a read error, never a short file. Either way the copy is marked
bad and repaired at once (`data_damage.py`), judged by the size the catalog lists now: a kept
listing may be older than the copy (its step deleted and registered again since).

How many connections it holds and how long each may take: `data_connections.py`.

Over TLS (`data_tls_cert`), with `data_tls_client_auth` the endpoint also requires a client
certificate of `data_tls_ca` (mutual TLS): a connection without one is refused at the handshake,
before its request is read, and counted by reason; the credential applies on top.

A restore reads every file of a checkpoint in a burst, over keep-alive connections: the catalog
is asked once per checkpoint for the verified copies this node holds of it, and that listing
answers the checkpoint's other requests for `data_access.LISTING_TTL` seconds. A path not in it
is looked up again (a copy verified since is served at once), never guessed; a copy that stopped
being verified may still be served for at most `LISTING_TTL` (its bytes are the registered ones,
and the reader checks them against the registered crc32c; a copy the endpoint itself finds bad
drops the listing at once).
"""

from __future__ import annotations

import io
import json
import os
import ssl
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from string import punctuation
from typing import Any, cast
from urllib.parse import quote_from_bytes

from tierpoint import logs, metrics_worker
from tierpoint.catalog.engine import Sessions
from tierpoint.config import Settings
from tierpoint.errors import CopyDamaged, CopyNotFound, TierpointError, UnsafePath, problem_body
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore
from tierpoint.storage.peer_http import staged_stripe
from tierpoint.storage.posix.page_cache import drop_cache
from tierpoint.storage.posix.reader import PosixReader
from tierpoint.storage.registry import open_store

from .data_access import Listings, authenticate, byte_range, data_path, stripe_source
from .data_connections import (
    Connections,
    DeadlineReader,
    handshake,
    next_request,
)
from .data_damage import DamagedCopies, RepairRequests
from .data_send import send_file, send_tls

log = logs.get(__name__)


def escaped_target(line: bytes) -> bytes:
    """The request line with every byte of its target outside printable ASCII percent-encoded,
    as a client would have sent it: http.server splits a line at any whitespace (a space, or a
    byte that Latin-1 calls one) and would refuse such a target before its headers, and so
    before its credential, are read. `parse_data_path` decodes it back."""
    method, sp, rest = line.rstrip(b"\r\n").partition(b" ")
    target, sp2, version = rest.rpartition(b" ")
    if not sp or not sp2 or not version.startswith(b"HTTP/"):
        return line
    return b"%s %s %s\r\n" % (method, quote_from_bytes(target, safe=punctuation).encode(), version)


class _Handler(BaseHTTPRequestHandler):
    server: DataServer
    protocol_version = "HTTP/1.1"
    # A request line without a version (HTTP/0.9's) is answered with a status line and headers
    # like any other, not with a bare body.
    default_request_version = "HTTP/1.0"
    # The headers go out in one small segment before the body: with Nagle's algorithm the body's
    # first segment would wait for the reader's delayed ACK of them (~40 ms per file).
    disable_nagle_algorithm = True
    # No server banner beyond the protocol's.
    server_version = "tierpoint"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.incoming = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self.incoming)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("data endpoint", request=format % args)

    def handle(self) -> None:
        """The connection's requests, each within the header deadline, until it closes or stays
        idle for `data_idle_timeout`."""
        settings = self.server.settings
        self.close_connection = True
        deadline = time.monotonic() + settings.data_header_timeout
        if isinstance(self.connection, ssl.SSLSocket) and not self._handshake(deadline):
            return
        self.incoming.deadline = deadline
        self.handle_one_request()
        while not self.close_connection:
            self.server.connections.waiting(self.connection)
            if not next_request(self.connection, settings.data_idle_timeout):
                return
            self.incoming.deadline = time.monotonic() + settings.data_header_timeout
            self.handle_one_request()

    def _handshake(self, deadline: float) -> bool:
        """The TLS handshake, before any request is read: with client authentication on, a
        client without a certificate the CA signed gets no further."""
        conn = cast(ssl.SSLSocket, self.connection)
        try:
            handshake(conn, deadline)
        except (ssl.SSLError, OSError) as exc:
            why = refusal(exc)
            metrics_worker.DATA_HANDSHAKES_REFUSED.labels(why).inc()
            log.warning(
                "data endpoint refused a TLS handshake", peer=self.client_address[0], why=why
            )
            return False
        finally:
            conn.setblocking(True)
        return True

    def parse_request(self) -> bool:
        self.raw_requestline: bytes = escaped_target(self.raw_requestline)
        if not super().parse_request():
            return False
        # Its request line and headers are in: the header deadline is met, and the connection
        # is answering, so no new connection may take its slot.
        self.incoming.deadline = None
        if not self.server.connections.answering(self.connection):
            self.close_connection = True
            return False
        self.connection.settimeout(self.server.settings.data_idle_timeout)
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, a method
        other than GET) as problem documents too, coded by the status."""
        status = HTTPStatus(code)
        phrase = message or status.phrase
        code_name = status.phrase.lower().replace(" ", "_").replace("-", "_")
        self._problem(problem_body(code, code_name, status.phrase, explain or phrase), {})
        self.close_connection = True

    def _refuse(self, exc: TierpointError) -> None:
        self._problem(exc.problem(), exc.response_headers() or {})

    def _problem(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        content = json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        self.send_response(body["status"], body["title"])
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)

    def do_GET(self) -> None:
        srv = self.server
        try:
            # guard: data-endpoint-credential-first
            who = authenticate(srv.sessions, srv.settings, self.headers.get("Authorization"))
            tier_name, ref = data_path(self.path)
            tier_name, index = staged_stripe(tier_name)
            who.check(ref.job)
            tier = next((t for t in srv.settings.tiers if t.name == tier_name), None)
            if tier is None or not tier.on_nodes:
                raise CopyNotFound(f"no local or peer tier {tier_name!r}")
            if index is None:
                store: TierStore = open_store(tier, srv.node)
                size = srv.listings.size(tier.name, ref.job, ref.step, ref.path, ref.branch)
            else:
                # A stripe staged here for its holder, or held here for a restore.
                store, size = stripe_source(srv.sessions, tier, srv.node, index, ref)
            if size is None:
                raise CopyNotFound("no verified copy of it on this node")
            span = byte_range(self.headers.get("Range"), size)
        except TierpointError as exc:
            self._refuse(exc)
            return
        self._send(tier.name, store, ref, size, span, who.name)

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
        except FileNotFoundError as exc:
            self._damaged(tier, ref, ReplicaState.LOST, f"gone: {exc}")
            return
        except UnsafePath as exc:
            self._damaged(tier, ref, ReplicaState.CORRUPT, f"unsafe: {exc}")
            return
        with reader:
            held = os.fstat(reader.fileno()).st_size
            # guard: data-endpoint-short-copy-refused
            if held != size:
                now = self._listed_now(tier, ref, held)
                if now is None:
                    return
                size, span = now
                start, end = span if span is not None else (0, size)
            self.send_response(HTTPStatus.PARTIAL_CONTENT if span is not None else HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            if span is not None:
                self.send_header("Content-Range", f"bytes {start}-{max(end - 1, start)}/{size}")
            self.end_headers()
            limiter = getattr(store, "limiter", None)
            idle = self.server.settings.data_idle_timeout
            if isinstance(self.connection, ssl.SSLSocket):
                sent = send_tls(self.connection, reader.fileno(), start, end, limiter)
            else:
                sent = send_file(self.connection, reader.fileno(), start, end, limiter, idle)
            if isinstance(reader, PosixReader) and reader.drops_behind:
                drop_cache(reader.fileno(), start, sent)
            if sent < end - start:
                # The file ended before its registered size while it was sent (it was truncated
                # under us): the reader must see a read error, never a short file, so the
                # connection is cut once the damage is recorded.
                self.close_connection = True
                # guard: data-endpoint-short-send-recorded
                self._record(
                    tier,
                    ref,
                    ReplicaState.CORRUPT,
                    f"ended after {start + sent} of its {size} registered bytes while served",
                )
        metrics_worker.DATA_BYTES_SERVED.labels(tier).inc(sent)
        log.debug("served", path=ref.path, bytes=sent, to=who)

    def _listed_now(
        self, tier: str, ref: ShardRef, held: int
    ) -> tuple[int, tuple[int, int] | None] | None:
        """A file not the size the kept listing says: the listing may be older than the copy
        (its step deleted and registered again since), so the catalog is asked again, and only
        its size of now condemns the copy. The size and span to serve, or None once refused."""
        listings = self.server.listings
        # guard: data-endpoint-condemns-by-the-catalog-of-now
        listings.forget(tier, ref.job, ref.step)
        size = listings.size(tier, ref.job, ref.step, ref.path)
        if size is None:
            self._refuse(CopyNotFound("no verified copy of it on this node"))
            return None
        if held != size:
            why = f"holds {held} of its {size} registered bytes"
            self._damaged(tier, ref, ReplicaState.CORRUPT, why)
            return None
        try:
            return size, byte_range(self.headers.get("Range"), size)
        except TierpointError as exc:
            self._refuse(exc)
            return None

    def _damaged(self, tier: str, ref: ShardRef, state: ReplicaState, why: str) -> None:
        """The copy is not what the catalog lists: record it, and say so instead of serving."""
        if self._record(tier, ref, state, why) is False:
            # Not listed as verified any more (an expiry deleted it since the listing was read).
            self._refuse(CopyNotFound("no verified copy of it on this node"))
            return
        self._refuse(CopyDamaged(f"the copy of {ref.path!r} on {tier} here is damaged ({why})"))

    def _record(self, tier: str, ref: ShardRef, state: ReplicaState, why: str) -> bool | None:
        """Whether the catalog's verified copy here was marked (None: it could not be told)."""
        try:
            marked = self.server.damage.record(tier, ref, state, why)
        except Exception as exc:
            # Unrecorded (the catalog is away): the reader still gets an error, not these
            # bytes, and the next read of the copy finds it again.
            log.warning("could not record a damaged copy", path=ref.path, error=repr(exc))
            return None
        # Marked now or before: either way the listing must not offer it again.
        self.server.listings.forget(tier, ref.job, ref.step, ref.branch)
        return marked


def refusal(exc: OSError) -> str:
    """A refused handshake's reason, as few distinct words as OpenSSL has reasons."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason or "certificate verify failed")
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or "tls error").lower().replace("_", " ")
    return "timeout" if isinstance(exc, TimeoutError) else "connection lost"


class DataServer(ThreadingHTTPServer):
    daemon_threads = True
    # The accept queue: a restore opens connections from many readers at once, and socketserver's
    # default of 5 would drop their SYNs into a second's retransmit.
    request_queue_size = 128

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        node: str,
        host: str,
        port: int,
        repairs: RepairRequests | None = None,
    ):
        """`repairs`: how a damaged copy's repair is asked for (None: it is only marked)."""
        self.settings, self.sessions, self.node = settings, sessions, node
        self.listings = Listings(sessions, node)
        self.connections = Connections(settings.data_max_connections)
        self.damage = DamagedCopies(sessions, node, repairs)
        super().__init__((host, port), _Handler)
        self.tls = settings.data_tls_cert is not None
        if settings.data_tls_cert is not None and settings.data_tls_key is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(settings.data_tls_cert, settings.data_tls_key)
            if settings.data_tls_client_auth:
                # Mutual TLS: OpenSSL checks the chain to the CA, the dates and that the
                # certificate may authenticate a client (its extended key usage, if any).
                # guard: data-endpoint-client-auth
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cafile=settings.data_tls_ca)
            # The handshake runs in the request's thread (on its first read), not in the thread
            # that accepts: a slow or silent client holds up no other.
            self.socket = ctx.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.connections.admit(request)

    def shutdown_request(self, request: Any) -> None:
        self.connections.release(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A reader that went away mid-answer, or a deadline: no traceback per connection.
        exc = sys.exc_info()[1]
        log.debug("data endpoint connection ended", peer=client_address[0], error=repr(exc))

    @property
    def url(self) -> str:
        if self.settings.data_url:
            return self.settings.data_url
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{name if ':' not in name else f'[{name}]'}:{port}"


def serve(
    settings: Settings,
    sessions: Sessions,
    node: str,
    port: int,
    repairs: RepairRequests | None = None,
) -> DataServer:
    """Start serving `node`'s files in a background thread; stop with `shutdown()`."""
    server = DataServer(settings, sessions, node, settings.data_host, port, repairs)
    threading.Thread(target=server.serve_forever, name=f"data-{node}", daemon=True).start()
    return server
