"""Every rank of a job restarting at the same moment, as lightweight clients that make exactly
the API calls a `TierpointReader` load makes (the real `tierpoint_client.Client` methods, each
rank's from a pool of threads with a client and a connection each), in two call patterns:

- `per-rank` (TierpointReader before only the coordinator talked to the API): the coordinator
  asks for the tiers, the latest restorable checkpoint with a lease, and the checkpoint's whole
  view; every other rank then takes a lease of its own; each rank releases its lease when its
  reads are done. 2 + 2R requests for R ranks.
- `coordinator` (TierpointReader now): the coordinator starts the load in one request (step,
  lease, view) and releases the one lease after the last rank's barrier; the ranks get their
  files' sources from it, not from the API. 2 requests.

`ready` is the time until every rank holds what it needs to start reading; the releases come
after it, as they do after a load's reads. The storage reads (`.metadata`, the files) are not
part of it: they do not touch the API. A rank whose lease or release fails after the client's
retries is counted (`failed`) and the others go on, as the other nodes of a job would; a
coordinator's failure ends the storm (no rank has a step to lease), which raises."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tierpoint_client import Client
from tierpoint_client.errors import ApiError, TierpointError

PATTERNS = ("per-rank", "coordinator")
LEASE_TTL = 1800
# Ranks sending at once: connections the lightweight clients hold open together.
CONCURRENCY = 64


@dataclass
class _Timed:
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    # Why the failed ones failed: "<call>: <status> <code>" or "<call>: <transport error>".
    causes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.latencies.append(time.perf_counter() - t0)

    def rank(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A rank's call: its failure (after the client's retries) counted, None returned."""
        try:
            return self.call(fn, *args)
        except TierpointError as exc:
            with self.lock:
                self.failed += 1
                self.causes[f"{fn.__name__}: {_cause(exc)}"] += 1
            return None


def _cause(exc: TierpointError) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.code}"
    cause = exc.__cause__
    return f"{type(exc).__name__} ({type(cause).__name__})" if cause else type(exc).__name__


def storm(
    clients: Callable[[], Client], job: str, ranks: int, node: str, pattern: str
) -> tuple[dict[str, float], Counter[str]]:
    """One restart of `ranks` ranks in `pattern`: seconds until every rank is ready, until every
    lease is released, the requests sent, those that failed, and their p50/p99 latency (ms); and
    the failed requests counted by cause."""
    timed = _Timed()
    local = threading.local()

    def client() -> Client:
        if not hasattr(local, "client"):
            local.client = clients()
        return local.client  # type: ignore[no-any-return]

    t0 = time.perf_counter()
    coordinator = clients()
    with ThreadPoolExecutor(min(CONCURRENCY, ranks)) as pool:
        if pattern == "per-rank":
            timed.call(coordinator.tiers)
            latest = timed.call(coordinator.latest, job, node=node, lease_ttl=LEASE_TTL)
            step = latest.step
            timed.call(coordinator.checkpoint, job, step)
            taken = pool.map(
                lambda r: timed.rank(client().create_lease, job, step, LEASE_TTL, f"rank {r}"),
                range(1, ranks),
            )
            leases = [latest.lease.id, *(lease.id for lease in taken if lease is not None)]
            ready = time.perf_counter() - t0
            list(pool.map(lambda lid: timed.rank(client().release_lease, job, step, lid), leases))
        elif pattern == "coordinator":
            start = timed.call(coordinator.start_restore, job, LEASE_TTL, node=node)
            ready = time.perf_counter() - t0
            timed.call(coordinator.release_lease, job, start.step, start.lease.id)
        else:
            raise ValueError(pattern)
    done = time.perf_counter() - t0
    ms = sorted(x * 1000 for x in timed.latencies)
    return {
        "ready": ready,
        "done": done,
        "requests": float(len(ms)),
        "failed": float(timed.failed),
        "p50": statistics.median(ms),
        "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
    }, timed.causes
