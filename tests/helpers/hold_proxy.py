"""An HTTP proxy in a thread of the test process that passes requests to a backend (moto S3) as
they are, except that a request whose target contains `hold` (or any of several) waits until
`release()`: a client
stuck in one request for as long as a test needs, e.g. a delete attempt that outlived its timeout
and is still on its way to S3. Heads and bodies are copied as they are on the wire
(tests/helpers/s3_proxy_http.py); each request gets its own connection to the backend."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Iterator

from tests.helpers.s3_proxy_http import HEAD_LIMIT, Head, Pace, read_head, relay_body

UNPACED = Pace(0)


class HoldProxy:
    def __init__(self, backend_url: str, hold: str | tuple[str, ...]) -> None:
        parsed = urllib.parse.urlsplit(backend_url)
        assert parsed.hostname is not None and parsed.port is not None
        self.backend = (parsed.hostname, parsed.port)
        self.hold = (hold,) if isinstance(hold, str) else hold
        self.url = ""
        self._held = 0
        # The held requests' client connections, to tell whether each client still waits.
        self._held_readers: list[asyncio.StreamReader] = []
        # Every request's target, in the order the requests arrived.
        self.seen: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> str:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0, limit=HEAD_LIMIT), self._loop
        ).result()
        self._server = server
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def held(self) -> int:
        """Requests waiting for `release()` (or released since)."""
        return self._held

    def still_waiting(self) -> int:
        """Held requests whose client has not closed its connection (given up) since."""
        return sum(1 for r in self._held_readers if not r.at_eof())

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._release.set)

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (head := await read_head(reader)) is not None:
                self.seen.append(head.first[1])
                if any(h in head.first[1] for h in self.hold):
                    self._held += 1
                    self._held_readers.append(reader)
                    await self._release.wait()
                if not await self._forward(head, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _forward(
        self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """One request and its response; False when the client connection must close."""
        if head.headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        up_reader, up_writer = await asyncio.open_connection(*self.backend, limit=HEAD_LIMIT)
        try:
            up_writer.write(head.raw)
            await relay_body(head, reader, up_writer, UNPACED, empty=head.bodiless_request)
            while True:
                resp = await read_head(up_reader)
                if resp is None:
                    raise ConnectionResetError("the backend closed the connection")
                if not resp.first[1].startswith("1"):
                    break
            empty = head.first[0] == "HEAD" or int(resp.first[1]) in (204, 304)
            writer.write(resp.raw)
            await relay_body(resp, up_reader, writer, UNPACED, empty=empty)
            await writer.drain()
        finally:
            up_writer.close()
            with contextlib.suppress(OSError):
                await up_writer.wait_closed()
        sized = empty or resp.length is not None or resp.chunked
        return sized and resp.headers.get("connection", "").lower() != "close"


@contextlib.contextmanager
def hold_proxy(backend_url: str, hold: str | tuple[str, ...]) -> Iterator[HoldProxy]:
    proxy = HoldProxy(backend_url, hold)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
