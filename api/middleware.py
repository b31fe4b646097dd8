"""Pure ASGI middleware (no BaseHTTPMiddleware: it would delay background tasks and copy bodies).

RequestObserver: request id, one structured log line and Prometheus metrics per request, timed to
the last byte of the response. BodySizeLimit: refuses request bodies over the configured sizes
from Content-Length, and while the body streams in for requests without one.
"""

from __future__ import annotations

import re
import time
import uuid

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemHTTPException, problem_response
from tierpoint import logs
from tierpoint.metrics_api import ApiMetrics

log = logs.get("tierpoint.api.access")

QUIET_ROUTES = frozenset({"/healthz", "/readyz"})
REGISTER_PATH = re.compile(r"^/v1/jobs/.*/checkpoints/?$")


class RequestObserver:
    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        status = 500
        finished: float | None = None

        async def observed_send(message: Message) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = time.perf_counter()
            await send(message)

        # Handlers bind what the request is about (logs.bind_checkpoint): the access line and
        # the background tasks after the response carry it too; then it is dropped, so that it
        # never leaks into the next request handled by the same task.
        outer = structlog.contextvars.get_contextvars()
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, observed_send)
            finally:
                duration = (finished or time.perf_counter()) - start
                route = scope.get("route")
                template = getattr(route, "path_format", None) or "unmatched"
                method = scope["method"]
                self.metrics.requests.labels(method, template, str(status)).inc()
                self.metrics.latency.labels(method, template).observe(duration)
                # Probes arrive every few seconds: keep them out of the info log.
                emit = log.debug if template in QUIET_ROUTES else log.info
                emit(
                    "request",
                    method=method,
                    path=scope["path"],
                    route=template,
                    status=status,
                    duration_ms=round(duration * 1000, 2),
                )
                structlog.contextvars.clear_contextvars()
                structlog.contextvars.bind_contextvars(**outer)


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            value: str = v.decode("latin-1")[:128]
            return value
    return None


def _too_large(limit: int, size: int | None, manifest: bool) -> ProblemHTTPException:
    got = f"{size} bytes" if size is not None else "more"
    what = "manifest" if manifest else "request body"
    return ProblemHTTPException(
        413,
        "manifest_too_large" if manifest else "request_too_large",
        "Manifest too large" if manifest else "Request too large",
        f"the {what} is {got}; the limit is {limit} bytes",
    )


class BodySizeLimit:
    """Every request body is bounded: manifests by `max_manifest_bytes`, any other body by
    `max_request_bytes`. Refused from Content-Length before a byte of the body is read, and while
    it streams in for requests without one, so an oversized body never reaches a handler."""

    def __init__(
        self, app: ASGIApp, max_manifest_bytes: int, max_request_bytes: int, metrics: ApiMetrics
    ) -> None:
        self.app = app
        self.max_manifest_bytes = max_manifest_bytes
        self.max_request_bytes = max_request_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        manifest = scope["method"] == "POST" and bool(REGISTER_PATH.match(scope["path"]))
        limit = self.max_manifest_bytes if manifest else self.max_request_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            exc = _too_large(limit, int(declared), manifest)
            await self._refuse(exc, scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                # guard: body-limit-streamed
                if seen > limit:
                    # FastAPI re-raises HTTPExceptions from body reading; the handler renders it.
                    raise _too_large(limit, None, manifest)
            return message

        await self.app(scope, limited_receive, send)

    async def _refuse(
        self, exc: ProblemHTTPException, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.metrics.problems.labels(exc.code).inc()
        response = problem_response(exc.status_code, exc.code, exc.title, str(exc.detail))
        # Tell the client not to keep sending a body we will not read.
        response.headers["connection"] = "close"
        await response(scope, receive, send)
