"""Retry and error mapping of the HTTP layer, against a scripted stdlib HTTP server.

The server only plays back status codes and bodies; the integration tests use the real API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tierpoint_client import (
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RetryPolicy,
    ServerError,
    TransportError,
)

from apps.devstack.services import free_port

FAST = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)


class Script:
    def __init__(self) -> None:
        self.replies: list[tuple[int, object]] = []
        self.requests: list[tuple[str, str, bytes, str | None]] = []


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            script.requests.append(
                (self.command, self.path, body, self.headers.get("Authorization"))
            )
            status, payload = script.replies.pop(0)
            raw = json.dumps(payload).encode() if payload is not None else b""
            self.send_response(status)
            ctype = "application/json" if status < 400 else "application/problem+json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for serve_forever to look at its flag, every poll_interval (0.5 s by
    # default: half a second per test).
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


def _problem(status: int, code: str) -> dict[str, object]:
    return {
        "type": "about:blank",
        "title": code,
        "status": status,
        "detail": f"d-{code}",
        "code": code,
    }


CHECKPOINT = {
    "job": "j",
    "step": 1,
    "tiers": [],
    "metadata": {},
    "total_bytes": 0,
    "shard_count": 0,
}


def test_5xx_is_retried_then_succeeds(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.replies = [(503, _problem(503, "unavailable")), (502, None), (201, CHECKPOINT)]
    client = Client(url, token="tok", retry=FAST)
    out = client.register_manifest("j", 1, [{"path": "a", "size": 1, "crc32c": None, "node": "n"}])
    assert out["step"] == 1
    assert len(script.requests) == 3
    method, path, body, auth = script.requests[-1]
    assert (method, path, auth) == ("POST", "/v1/jobs/j/checkpoints", "Bearer tok")
    assert json.loads(body) == {
        "step": 1,
        "shards": [{"path": "a", "size": 1, "crc32c": None, "node": "n"}],
        "metadata": {},
    }


def test_429_is_retried(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.replies = [(429, _problem(429, "too_many_requests")), (200, [])]
    assert Client(url, retry=FAST).tiers() == []
    assert len(script.requests) == 2


def test_persistent_5xx_raises_server_error(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.replies = [(500, _problem(500, "internal"))] * 3
    with pytest.raises(ServerError) as info:
        Client(url, retry=FAST).tiers()
    assert info.value.code == "internal"
    assert len(script.requests) == 3


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (409, "checkpoint_conflict", ConflictError),
        (422, "unsafe_path", InvalidRequestError),
        (413, "manifest_too_large", InvalidRequestError),
        (404, "checkpoint_not_found", NotFoundError),
    ],
)
def test_4xx_is_not_retried_and_carries_the_problem(
    scripted: tuple[str, Script], status: int, code: str, cls: type[Exception]
) -> None:
    url, script = scripted
    script.replies = [(status, _problem(status, code))]
    with pytest.raises(cls) as info:
        Client(url, retry=FAST).checkpoint("j", 1)
    err = info.value
    assert (err.status, err.code, err.detail) == (status, code, f"d-{code}")  # type: ignore[attr-defined]
    assert len(script.requests) == 1


def test_latest_is_none_only_for_no_restorable_checkpoint(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.replies = [
        (404, _problem(404, "no_restorable_checkpoint")),
        (404, _problem(404, "unknown_tier")),
    ]
    client = Client(url, retry=FAST)
    assert client.latest("j", tier="s3") is None
    with pytest.raises(NotFoundError):
        client.latest("j", tier="nope")
    assert script.requests[0][1] == "/v1/jobs/j/checkpoints/latest?tier=s3"


def test_connection_refused_is_retried_then_raises_transport_error() -> None:
    client = Client(f"http://127.0.0.1:{free_port()}", retry=FAST, timeout=2)
    with pytest.raises(TransportError, match="3 attempts"):
        client.tiers()


def test_bad_api_url_is_refused() -> None:
    with pytest.raises(ValueError):
        Client("localhost:8080")
