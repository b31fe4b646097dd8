"""An HTTP proxy that makes an S3 endpoint (moto) behave as S3 does at scale, run as a process of
its own: per-request latency, a bandwidth cap per connection, and 503 `SlowDown` above a request
rate per partitioned prefix, or for a fraction of requests during a "storm" switched on from
outside. The tests and the benchmarks (`benchmarks/scenarios/s3_shaping.py`) both start it.

Requests and responses pass through byte for byte: the client signs its requests (SigV4) for the
proxy's address, and the Host header it signed is what the backend sees. Path-style addressing
only (the bucket is the path's first segment), as tierpoint uses for custom endpoints.
A `SlowDown` closes the connection when the client waits on `Expect: 100-continue` (its body may
or may not follow; clients open a new connection); otherwise the body is read and the connection
kept.

Control, on the same port under `/_shaping/` (no bucket name starts with `_`):
`GET /_shaping/stats` (JSON counters) and `POST /_shaping/storm?fraction=F&seconds=S`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apps.devstack.services import stop_popen
from tests.helpers.s3_proxy_http import HEAD_LIMIT, Head, Pace, read_head, relay_body, response

CONTROL = "/_shaping/"
READS = frozenset({"GET", "HEAD"})
SLOWDOWN_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    "<Message>Please reduce your request rate.</Message>"
    "<RequestId>{rid}</RequestId><HostId>tierpoint-shaping-proxy</HostId></Error>"
)


@dataclass(frozen=True)
class Shaping:
    """What the proxy does to each request. S3's documented figures are the defaults: at least
    3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per partitioned prefix,
    and about 90 MB/s on one connection; its first-byte latency is tens of milliseconds."""

    latency_min: float = 0.020
    latency_max: float = 0.050
    bandwidth: float = 90e6  # bytes/s per connection and direction; 0 = no cap
    write_rate: int = 3500  # requests/s per prefix; 0 = no limit
    read_rate: int = 5500
    # Key path segments (after the bucket) that name a partitioned prefix: 1 = `job/`.
    prefix_depth: int = 1
    # Keep the client's connection when the backend closes its own after a sized response, as
    # S3 keeps connections (moto's server closes each); the next request opens a new upstream.
    keep_alive: bool = False


@dataclass
class Stats:
    connections: int = 0  # client connections accepted
    requests: int = 0
    forwarded: int = 0
    slowdown_rate: int = 0
    slowdown_storm: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    forwarded_by_method: dict[str, int] = field(default_factory=dict)
    slowdown_by_method: dict[str, int] = field(default_factory=dict)

    def count(self, what: dict[str, int], method: str) -> None:
        what[method] = what.get(method, 0) + 1


class Proxy:
    def __init__(self, backend: tuple[str, int], shaping: Shaping) -> None:
        self.backend = backend
        self.shaping = shaping
        self.stats = Stats()
        self.storm_until = 0.0
        self.storm_fraction = 0.0
        self.storm_debt = 0.0
        self.windows: dict[tuple[str, bool], collections.deque[float]] = {}

    def prefix(self, target: str) -> str:
        path = urllib.parse.unquote(urllib.parse.urlsplit(target).path).lstrip("/")
        bucket, _, key = path.partition("/")
        return "/".join([bucket, *key.split("/")[: self.shaping.prefix_depth]])

    def throttled(self, method: str, target: str) -> str | None:
        """Why this request gets a SlowDown ("storm" or "rate"), or None."""
        now = time.monotonic()
        if now < self.storm_until:
            # Every 1/fraction-th request, the storm's first one included: not drawn at random,
            # so that a storm of any length refuses something and never refuses a run of
            # requests longer than the fraction says.
            self.storm_debt += self.storm_fraction
            if self.storm_debt >= 1.0:
                self.storm_debt -= 1.0
                return "storm"
        read = method in READS
        limit = self.shaping.read_rate if read else self.shaping.write_rate
        if limit <= 0:
            return None
        window = self.windows.setdefault((self.prefix(target), read), collections.deque())
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= limit:
            return "rate"
        window.append(now)
        return None

    def control(self, method: str, target: str) -> tuple[int, bytes]:
        parts = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(parts.query))
        if parts.path == CONTROL + "storm" and method == "POST":
            self.storm_fraction = float(query.get("fraction", "1"))
            self.storm_debt = 1.0 - self.storm_fraction
            self.storm_until = time.monotonic() + float(query.get("seconds", "5"))
        elif parts.path != CONTROL + "stats":
            return 404, b"{}"
        body = dict(asdict(self.stats), storm_fraction=self.storm_fraction)
        body["storm_left"] = max(0.0, self.storm_until - time.monotonic())
        return 200, json.dumps(body).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        self.stats.connections += 1
        try:
            await conn.serve()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client or backend that went away mid-message: drop the connection
        finally:
            await conn.close()


class Connection:
    """One client connection and its own connection to the backend (opened on first use)."""

    def __init__(
        self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy, self.reader, self.writer = proxy, reader, writer
        self.up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.pace_in = Pace(proxy.shaping.bandwidth)
        self.pace_out = Pace(proxy.shaping.bandwidth)

    async def serve(self) -> None:
        while (head := await read_head(self.reader)) is not None:
            if not await self.one(head):
                return

    async def one(self, head: Head) -> bool:
        """Answers one request; False when the connection must close."""
        method, target = head.first[0], head.first[1]
        stats, shaping = self.proxy.stats, self.proxy.shaping
        if target.startswith(CONTROL):
            await relay_body(head, self.reader, None, self.pace_in, empty=head.bodiless_request)
            status, body = self.proxy.control(method, target)
            self.writer.write(response(status, "OK", body, "application/json", False))
            await self.writer.drain()
            return True
        stats.requests += 1
        await asyncio.sleep(random.uniform(shaping.latency_min, shaping.latency_max))
        expects = head.headers.get("expect", "").lower() == "100-continue"
        why = self.proxy.throttled(method, target)
        if why is not None:
            setattr(stats, f"slowdown_{why}", getattr(stats, f"slowdown_{why}") + 1)
            stats.count(stats.slowdown_by_method, method)
            if not expects:
                await relay_body(head, self.reader, None, self.pace_in, empty=head.bodiless_request)
            body = b"" if method == "HEAD" else SLOWDOWN_XML.format(rid=uuid.uuid4().hex).encode()
            self.writer.write(response(503, "Slow Down", body, "application/xml", expects))
            await self.writer.drain()
            return not expects
        if expects:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writer.drain()
        stats.forwarded += 1
        stats.count(stats.forwarded_by_method, method)
        return await self.forward(head, method)

    async def upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.up is None:
            host, port = self.proxy.backend
            self.up = await asyncio.open_connection(host, port, limit=HEAD_LIMIT)
        return self.up

    async def forward(self, head: Head, method: str) -> bool:
        up_reader, up_writer = await self.upstream()
        up_writer.write(head.raw)
        self.proxy.stats.bytes_up += await relay_body(
            head, self.reader, up_writer, self.pace_in, empty=head.bodiless_request
        )
        while True:
            resp = await read_head(up_reader)
            if resp is None:
                raise ConnectionResetError("the backend closed the connection")
            if not resp.first[1].startswith("1"):
                break  # the 100 Continue was ours to send; the backend's goes no further
        empty = method == "HEAD" or int(resp.first[1]) in (204, 304)
        sized = empty or resp.length is not None or resp.chunked
        kept = self.proxy.shaping.keep_alive and sized
        if kept and resp.headers.get("connection", "").lower() == "close":
            resp.raw = re.sub(rb"(?im)^connection:\s*close\r\n", b"", resp.raw)
        self.writer.write(resp.raw)
        self.proxy.stats.bytes_down += await relay_body(
            resp, up_reader, self.writer, self.pace_out, empty=empty
        )
        closes = resp.headers.get("connection", "").lower() == "close" or (
            not empty and resp.length is None and not resp.chunked
        )
        if closes:
            await self.close_upstream()
        return kept or not closes

    async def close_upstream(self) -> None:
        if self.up is not None:
            _, w = self.up
            self.up = None
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()

    async def close(self) -> None:
        await self.close_upstream()
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def serve(proxy: Proxy, port: int) -> None:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port, limit=HEAD_LIMIT)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", required=True, help="host:port of the S3 endpoint")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--shaping", default="{}", help="JSON of Shaping's fields")
    args = p.parse_args(argv)
    host, port = args.backend.rsplit(":", 1)
    proxy = Proxy((host, int(port)), Shaping(**json.loads(args.shaping)))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(proxy, args.port))


@dataclass
class ShapingProxy:
    """The proxy as a child process in front of `backend_url` (http://host:port)."""

    backend_url: str
    shaping: Shaping = field(default_factory=Shaping)
    port: int = 0
    _proc: subprocess.Popen[str] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> str:
        parts = urllib.parse.urlsplit(self.backend_url)
        if parts.scheme != "http":
            raise ValueError(f"the shaping proxy speaks plain HTTP, not {self.backend_url!r}")
        backend = parts.netloc
        args = ["--backend", backend, "--port", str(self.port)]
        args += ["--shaping", json.dumps(asdict(self.shaping))]
        root = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.s3_proxy", *args],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the S3 shaping proxy did not start: {line!r}")
        self.port = int(line.split()[1])
        return self.endpoint_url

    def _call(self, method: str, path: str) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(self.endpoint_url + CONTROL + path, method=method)
        with opener.open(req, timeout=10) as r:
            return dict(json.loads(r.read()))

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "stats")

    def storm(self, fraction: float, seconds: float) -> dict[str, Any]:
        """SlowDown to `fraction` of the requests (0-1) for `seconds`; 0 seconds ends a storm."""
        return self._call("POST", f"storm?fraction={fraction}&seconds={seconds}")

    def stop(self) -> None:
        stop_popen(self._proc)
        self._proc = None


@contextlib.contextmanager
def shaping_proxy(backend_url: str, shaping: Shaping | None = None) -> Iterator[ShapingProxy]:
    proxy = ShapingProxy(backend_url, shaping or Shaping())
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
