"""A token bucket shared by every reader of one tier on one node, so that copies off the local
tier never take more than the configured bandwidth from training, however many run at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Thread-safe byte-rate limiter. `rate` bytes/s (0 = unlimited), bursts up to `burst` bytes.

    `consume(n)` takes n tokens and sleeps off any debt, so a caller asking for more than the
    burst (one big chunk) still gets the average rate, and concurrent callers queue fairly: each
    reserves its share under the lock and sleeps outside it. The default burst is 50 ms worth:
    a copy's reads are chunks of megabytes, each paid for by sleeping off its debt, so the
    burst buys them nothing; a larger one would only let each copy start at the disk's full
    speed (a quarter second's worth averages a 2 s copy 14% above its limit) and take that from
    the training job's reads.
    """

    def __init__(
        self,
        rate: int,
        burst: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must be >= 0")
        self.rate = rate
        self.burst = burst if burst is not None else max(rate // 20, 1)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._last = clock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def reserve(self, n: int) -> float:
        """Take n tokens now; return how long the caller must wait before using them."""
        if self.rate <= 0 or n <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def consume(self, n: int) -> None:
        wait = self.reserve(n)
        if wait > 0:
            self._sleep(wait)
