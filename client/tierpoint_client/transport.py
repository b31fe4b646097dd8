"""JSON over HTTP with the standard library, retrying what is safe to retry; and the reads of an
HTTP body straight into the caller's memory that every streamed source shares."""

from __future__ import annotations

import functools
import http.client
import json
import os
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierpoint_client._version import __version__
from tierpoint_client.errors import ApiError, TransportError, error_for


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    initial_backoff: float = 0.2
    max_backoff: float = 5.0

    def delay(self, attempt: int) -> float:
        # Full jitter: many nodes restarting at once should not retry in lockstep.
        cap = min(self.max_backoff, self.initial_backoff * (2**attempt))
        return random.uniform(cap / 2, cap)


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


class Transport:
    def __init__(
        self,
        api_url: str,
        token: str | None,
        timeout: float,
        retry: RetryPolicy,
        tls: ApiTls | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(api_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"api_url must be an http(s) URL, got {api_url!r}")
        self.base = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry = retry
        # No proxies from the environment: the API is usually on the cluster network, and a
        # proxy set for internet access would intercept it.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if parsed.scheme == "https":
            context = (tls or ApiTls.from_env()).context()
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
    ) -> Response:
        """Send the request; retry connection errors and 5xx; raise ApiError for other errors.

        Every call site is idempotent (GETs, and registration which returns the existing
        checkpoint for the same manifest), so retrying after an ambiguous failure is safe.
        """
        url = self.base + path
        if query:
            params = {k: v for k, v in query.items() if v is not None}
            if params:
                url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Accept": "application/json", "User-Agent": f"tierpoint-client/{__version__}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"

        last: Exception | None = None
        retry_after = 0.0
        for attempt in range(self.retry.attempts):
            if attempt:
                time.sleep(max(self.retry.delay(attempt - 1), retry_after))
                retry_after = 0.0
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    return Response(resp.status, _decode(resp.read()))
            except urllib.error.HTTPError as e:
                err = _api_error(e)
                if e.code >= 500 or e.code == 429:
                    last = err
                    retry_after = _retry_after(e, self.retry.max_backoff)
                    continue
                raise err from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                # Connection refused/reset, timeouts, truncated responses.
                last = e
                continue
        if isinstance(last, ApiError):
            raise last
        raise TransportError(
            f"{method} {url} failed after {self.retry.attempts} attempts: {last}"
        ) from last


def _retry_after(e: urllib.error.HTTPError, cap: float) -> float:
    """Seconds the server asked us to wait (delta-seconds form only), capped."""
    value = e.headers.get("Retry-After") if e.headers else None
    try:
        return min(max(float(value), 0.0), cap) if value else 0.0
    except ValueError:
        return 0.0


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    return json.loads(raw)


def _api_error(e: urllib.error.HTTPError) -> ApiError:
    try:
        raw = e.read()
    except (OSError, http.client.HTTPException):
        raw = b""
    problem: dict[str, Any] | None = None
    try:
        parsed = json.loads(raw) if raw else None
        if isinstance(parsed, dict):
            problem = parsed
    except ValueError:
        pass
    code = problem.get("code") if problem else None
    raw_detail = problem.get("detail") if problem else None
    detail: str | None
    if raw_detail is None or isinstance(raw_detail, str):
        detail = raw_detail
    else:
        detail = json.dumps(raw_detail)
    if detail is None and problem and "title" in problem:
        detail = str(problem["title"])
    if detail is None and raw:
        detail = raw[:500].decode("utf-8", "replace")
    return error_for(e.code, code, detail, problem)


def sized_readinto(resp: http.client.HTTPResponse) -> Callable[[memoryview], int]:
    """The response's own `readinto` (the socket's bytes straight into the caller's memory; 0
    at the end of the body), but a body cut off before its Content-Length raises IncompleteRead:
    `http.client` ends it as if it were complete, and a short read taken for a copy shorter than
    registered would condemn a good copy for a network fault."""
    readinto = resp.readinto

    def checked(view: memoryview) -> int:
        n = readinto(view)
        # guard: restore-cut-body
        if not n and len(view) and resp.length:
            raise http.client.IncompleteRead(b"", resp.length)
        return n

    return checked


def read_full(readinto: Callable[[memoryview], int], view: memoryview) -> int:
    """Fill `view` through `readinto`; fewer bytes only at the stream's end (a socket read
    returns whatever has arrived, often much less than asked for)."""
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            break
        got += n
    return got


# How the client trusts an https API: the CA bundle that signed its certificate (else the
# system roots), and for an API that requires one (mutual TLS) a client certificate and key.
API_TLS_CA = "TIERPOINT_API_TLS_CA"
API_TLS_CLIENT_CERT = "TIERPOINT_API_TLS_CLIENT_CERT"
API_TLS_CLIENT_KEY = "TIERPOINT_API_TLS_CLIENT_KEY"


@dataclass(frozen=True)
class ApiTls:
    """The TLS of the client's connections to an https API: the CA to trust (None: the system
    roots) and the client certificate to present (mutual TLS)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls) -> ApiTls:
        env = os.environ
        return cls(
            env.get(API_TLS_CA) or None,
            env.get(API_TLS_CLIENT_CERT) or None,
            env.get(API_TLS_CLIENT_KEY) or None,
        )

    def context(self) -> ssl.SSLContext:
        return tls_context(self.ca, self.cert, self.key)


@functools.lru_cache(maxsize=4)
def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A client's TLS context: trusting `ca` (None: the system roots, or SSL_CERT_FILE's bundle)
    and presenting `cert` and `key` to a server that requires one (mutual TLS). Made once per
    set of values, for the API's connections and the data endpoints' alike."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx
