"""The API's Temporal client, which Temporal being down must not break.

Registration commits to the catalog and answers without Temporal; the workflow start that follows
uses the client if there is one. A missing client is reconnected lazily, at most once per
`retry_interval`, so a Temporal outage costs a request nothing but a log line.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from temporalio.client import Client

from tierpoint import logs
from tierpoint.config import Settings
from tierpoint.temporal import connect

log = logs.get(__name__)


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
                self._client = await asyncio.wait_for(
                    connect(self._settings), timeout=self._connect_timeout
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
