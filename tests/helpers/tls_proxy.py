"""A Temporal frontend that requires mutual TLS, for tests: a certificate authority
(tests/helpers/pki.py), and a TLS-terminating TCP proxy in front of the suite's Temporal dev
server (which has no TLS option of its own). The proxy decrypts and forwards the bytes
unchanged: gRPC's HTTP/2 runs end to end, so it needs no HTTP/2 of its own, only ALPN `h2` in
the handshake, as Temporal Cloud offers it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.helpers.pki import Pki


@dataclass
class TlsProxy:
    """Listens on 127.0.0.1:`port` with the server certificate, admits only clients with a
    certificate of the CA, and forwards each connection to `backend` (host:port)."""

    pki: Pki
    backend: str
    port: int = 0
    # Common names of the client certificates of accepted connections, in order.
    clients: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.pki.ca))
        ctx.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        subject = dict(x[0] for x in peer.get("subject", ()))
        self.clients.append(str(subject.get("commonName")))
        host, port = self.backend.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> None:
        started = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def serve() -> None:
            server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, ssl=self._context()
            )
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await server.serve_forever()

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(serve())

        self._thread = threading.Thread(target=run, name="tls-proxy", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise TimeoutError("the TLS proxy did not start")

    def stop(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(10)


@contextlib.contextmanager
def tls_proxy(pki: Pki, backend: str) -> Iterator[TlsProxy]:
    proxy = TlsProxy(pki, backend)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
