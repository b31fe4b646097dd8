"""The API's Temporal client, which Temporal being down must not break.

Registration commits to the catalog and answers without Temporal; the workflow start that follows
uses the client if there is one. A missing client is reconnected lazily, at most once per
`retry_interval`, so a Temporal outage costs a request nothing but a log line.

A server that accepts connections but does not answer (stalled, overloaded) must not hold a
request either: every call of the API's client carries a deadline (`temporal_rpc_timeout`, set by
`Deadlines` on each call that has none of its own), and a call that misses it is answered 503
`temporal_unavailable` (api/problems.py). Waiting for a workflow's result is a long poll, not a
call with a deadline: its callers bound that wait themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client, Interceptor, OutboundInterceptor

from tierpoint import logs
from tierpoint.config import Settings
from tierpoint.temporal import connect

log = logs.get(__name__)


class _Deadlines(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, timeout: timedelta) -> None:
        super().__init__(next)
        self.timeout = timeout

    def bounded(self, call: Any) -> Any:
        if not dataclasses.is_dataclass(call) or isinstance(call, type):
            return call
        if getattr(call, "rpc_timeout", timedelta(0)) is not None:
            return call  # the caller chose its own deadline (or the call takes none)
        if getattr(call, "wait_new_event", False):
            return call  # a long poll for a result: its caller bounds it
        return dataclasses.replace(call, rpc_timeout=self.timeout)


def _bounded_call(name: str) -> Callable[..., Any]:
    def call(self: _Deadlines, input: Any) -> Any:
        return getattr(self.next, name)(self.bounded(input))

    call.__name__ = name
    return call


# Every outbound call, including ones a later SDK adds: each takes one input dataclass.
for _name, _ in inspect.getmembers(OutboundInterceptor, inspect.isfunction):
    if not _name.startswith("_"):
        setattr(_Deadlines, _name, _bounded_call(_name))


class Deadlines(Interceptor):
    """Gives every call of the client that has no deadline of its own this one."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Deadlines(next, self.timeout)


class TemporalLink:
    def __init__(
        self, settings: Settings, *, connect_timeout: float = 3.0, retry_interval: float = 5.0
    ) -> None:
        self._settings = settings
        self._connect_timeout = connect_timeout
        self._retry_interval = retry_interval
        self._client: Client | None = None
        self._last_attempt = float("-inf")
        self._last_error: str | None = None
        self._lock = asyncio.Lock()

    @property
    def last_error(self) -> str | None:
        return self._last_error

    async def client(self, *, force: bool = False) -> Client | None:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is not None:
                return self._client
            if not force and time.monotonic() - self._last_attempt < self._retry_interval:
                return None
            self._last_attempt = time.monotonic()
            try:
                deadlines = Deadlines(timedelta(seconds=self._settings.temporal_rpc_timeout))
                self._client = await asyncio.wait_for(
                    connect(self._settings, [deadlines]), timeout=self._connect_timeout
                )
                self._last_error = None
                log.info("temporal connected", address=self._settings.temporal_address)
            except Exception as exc:
                self._last_error = (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
                log.warning(
                    "temporal unreachable; registrations go on, the reconciler starts workflows",
                    address=self._settings.temporal_address,
                    error=self._last_error,
                )
            return self._client

    async def check(self, rpc_timeout: float = 3.0) -> str | None:
        """None when Temporal answers a health check, else what is wrong."""
        client = await self.client(force=True)
        if client is None:
            return f"unreachable at {self._settings.temporal_address}: {self._last_error}"
        try:
            ok = await client.service_client.check_health(timeout=timedelta(seconds=rpc_timeout))
        except Exception as exc:
            return f"health check failed: {type(exc).__name__}: {exc}"
        return None if ok else "health check answered not serving"
