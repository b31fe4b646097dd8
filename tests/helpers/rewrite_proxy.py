"""An HTTP proxy in a thread of the test process in front of the API: requests pass as they are,
and in each response body every `old` is replaced by `new` (the length fixed), e.g. a holder's
data endpoint address by that of a proxy in front of it (tests/helpers/flip_proxy.py), so that a
client reads that holder's stripes through the proxy while the holder still advertises its own
address. One response at a time per connection; bodies are read whole (the API's are small)."""

from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

# Hop-by-hop, or no longer true once the body changed.
_DROPPED = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _handler(backend: tuple[str, int], old: bytes, new: bytes) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROPPED}
            conn = http.client.HTTPConnection(*backend, timeout=120)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read().replace(old, new)
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _DROPPED:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def rewrite_proxy(backend_url: str, old: str, new: str) -> Iterator[str]:
    """The proxy's URL while it runs."""
    parsed = urllib.parse.urlsplit(backend_url)
    assert parsed.hostname is not None and parsed.port is not None
    handler = _handler((parsed.hostname, parsed.port), old.encode(), new.encode())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="rewrite-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
