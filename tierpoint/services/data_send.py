"""How the data endpoint sends a served file's bytes: with sendfile, page cache to socket and no
copy through Python; over TLS, which sendfile cannot encrypt, read and sent a chunk at a time.
Either way through the tier's read limiter, and either way the count of bytes sent tells the
endpoint whether the file ended before its registered size while it was sent."""

from __future__ import annotations

import os
import socket
import ssl

from tierpoint.storage.throttle import TokenBucket

from .data_connections import wait_writable

CHUNK = 8 * 1024 * 1024


def send_file(
    sock: socket.socket, fd: int, start: int, end: int, limiter: TokenBucket | None, idle: float
) -> int:
    """Bytes [start, end) of `fd` to the socket with sendfile (page cache to socket, no copy
    through Python), a chunk at a time through the tier's read limiter; how many were sent
    (fewer: the file ended first). TimeoutError when the reader takes nothing for `idle`."""
    pos = start
    while pos < end:
        try:
            n = os.sendfile(sock.fileno(), fd, pos, min(CHUNK, end - pos))
        except BlockingIOError:  # the socket has a timeout, so it does not block: wait here
            wait_writable(sock, idle)
            continue
        if not n:
            break
        if limiter is not None:
            limiter.consume(n)
        pos += n
    return pos - start


def send_tls(
    conn: ssl.SSLSocket, fd: int, start: int, end: int, limiter: TokenBucket | None
) -> int:
    """As `send_file` over TLS, which sendfile cannot encrypt: read, then encrypt and send (the
    socket's timeout bounds each wait for the reader)."""
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
