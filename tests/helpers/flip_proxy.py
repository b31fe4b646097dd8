"""An HTTP proxy that damages bodies in transit, run as a process of its own: it passes requests
to a backend (a node's data endpoint, or S3) as they are, and in the body of the first `flips`
200 or 206 responses (or of every one, `flips` -1) it flips one bit of the byte in the middle, or
with `cut` closes the connection there instead, the head having promised the whole body.
Everything else passes byte for byte. One request per client connection (as `PeerSource` asks).

Control, on the same port: `GET /_flip/stats` (JSON: responses passed on, bodies damaged).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apps.devstack.services import stop_popen
from tests.helpers.s3_proxy_http import HEAD_LIMIT, Head, read_head, response

CONTROL = "/_flip/"
CHUNK = 64 * 1024


@dataclass
class Stats:
    responses: int = 0
    flipped: int = 0
    cut: int = 0  # bodies ended at their middle by closing the connection
    # The byte offset in the body (not in the file) of each flip, in order.
    at: list[int] = field(default_factory=list)


class FlipProxy:
    def __init__(self, backend: tuple[str, int], flips: int, cut: bool = False) -> None:
        self.backend, self.left, self.cut, self.stats = backend, flips, cut, Stats()

    def take_flip(self) -> bool:
        if self.left == 0:
            return False
        self.left -= 1 if self.left > 0 else 0
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await read_head(reader)
            if head is None:
                return
            if head.first[1].startswith(CONTROL):
                body = json.dumps(asdict(self.stats)).encode()
                writer.write(response(200, "OK", body, "application/json", True))
            else:
                await self.forward(head, writer)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # a client or backend gone mid-message: drop the connection, as a network does
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def forward(self, head: Head, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.backend, limit=HEAD_LIMIT)
        try:
            up_writer.write(head.raw)  # a GET: no body to pass on
            await up_writer.drain()
            resp = await read_head(up_reader)
            if resp is None:
                raise ConnectionResetError("the backend closed the connection")
            writer.write(resp.raw)
            self.stats.responses += 1
            length = resp.length or 0
            ok = resp.first[1] in ("200", "206")
            flip_at = length // 2 if ok and length and self.take_flip() else -1
            done = 0
            while done < length:
                if self.cut and done == flip_at:
                    self.stats.cut += 1
                    return  # the connection is closed mid-body
                end = flip_at if self.cut and done < flip_at else length
                data = bytearray(await up_reader.read(min(CHUNK, end - done)))
                if not data:
                    raise asyncio.IncompleteReadError(b"", length - done)
                if not self.cut and done <= flip_at < done + len(data):
                    data[flip_at - done] ^= 0x01
                    self.stats.flipped += 1
                    self.stats.at.append(flip_at)
                writer.write(data)
                await writer.drain()
                done += len(data)
        finally:
            up_writer.close()
            with contextlib.suppress(OSError):
                await up_writer.wait_closed()


async def serve(proxy: FlipProxy, port: int) -> None:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port, limit=HEAD_LIMIT)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", required=True, help="host:port of the data endpoint")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--flips", type=int, default=1, help="bodies to damage; -1 for every one")
    p.add_argument("--cut", action="store_true", help="close mid-body instead of flipping a bit")
    args = p.parse_args(argv)
    host, port = args.backend.rsplit(":", 1)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(FlipProxy((host, int(port)), args.flips, args.cut), args.port))


@dataclass
class FlipProxyProcess:
    """The proxy as a child process in front of `backend` (host:port)."""

    backend: str
    flips: int
    cut: bool = False
    port: int = 0
    _proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        args = ["--backend", self.backend, "--port", str(self.port), "--flips", str(self.flips)]
        args += ["--cut"] if self.cut else []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.flip_proxy", *args],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the flipping proxy did not start: {line!r}")
        self.port = int(line.split()[1])
        return self.url

    def stats(self) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.url + CONTROL + "stats", timeout=10) as r:
            return dict(json.loads(r.read()))

    def stop(self) -> None:
        stop_popen(self._proc)
        self._proc = None


@contextlib.contextmanager
def flip_proxy(backend: str, flips: int, cut: bool = False) -> Iterator[FlipProxyProcess]:
    proxy = FlipProxyProcess(backend, flips, cut)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
