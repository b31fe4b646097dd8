"""HTTP/1.1 as the S3-shaping proxy (tests/helpers/s3_proxy.py) needs it: message heads read and
passed on as they are, bodies copied as they are on the wire (sized, chunked, or to the end of the
stream) through a bandwidth cap, and the proxy's own answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

CHUNK = 64 * 1024
# Bytes a connection may send at once after being idle, before the cap paces it.
BURST = 256 * 1024
HEAD_LIMIT = 1024 * 1024


class Pace:
    """A token bucket for one direction of one connection."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.debt = 0.0
        self.t = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.debt = max(0.0, self.debt - (now - self.t) * self.rate) + n
        self.t = now
        wait = (self.debt - BURST) / self.rate
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class Head:
    raw: bytes
    first: list[str]  # request or status line, split
    headers: dict[str, str]  # lower-cased names; the raw bytes are what is sent

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def length(self) -> int | None:
        value = self.headers.get("content-length")
        return None if value is None else int(value)

    @property
    def bodiless_request(self) -> bool:
        # A request has a body only when it says so; a response without either runs to EOF.
        return self.length is None and not self.chunked


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """The next message head, or None at a clean end of the stream."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    lines = raw[:-4].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Head(raw, lines[0].split(" ", 2), headers)


async def relay_body(
    head: Head,
    reader: asyncio.StreamReader,
    out: asyncio.StreamWriter | None,
    pace: Pace,
    *,
    empty: bool = False,
) -> int:
    """Copy one message body as it is on the wire (chunked or sized; to the end of the stream
    when neither); `out` None reads it away. Returns the bytes copied."""

    async def piece(data: bytes) -> None:
        await pace.take(len(data))
        if out is not None:
            out.write(data)
            await out.drain()

    n = 0
    if empty:
        return 0
    if head.chunked:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0], 16)
            data = line + await reader.readexactly(size + 2) if size else line
            if not size:  # trailers up to the empty line
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    data += trailer
                data += b"\r\n"
            await piece(data)
            n += len(data)
            if not size:
                return n
    left = head.length
    while left is None or left > 0:
        data = await reader.read(CHUNK if left is None else min(CHUNK, left))
        if not data:
            if left is None:
                return n
            raise asyncio.IncompleteReadError(b"", left)
        await piece(data)
        n += len(data)
        left = None if left is None else left - len(data)
    return n


def response(status: int, reason: str, body: bytes, content_type: str, close: bool) -> bytes:
    head = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"x-amz-request-id: {uuid.uuid4().hex[:16].upper()}",
        "Server: AmazonS3",
    ]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
