"""Prometheus metrics of the workers (copies, verifications, corruption, activity durations)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram, start_http_server

BYTES_COPIED = Counter(
    "tierpoint_worker_bytes_copied",
    "Bytes copied to a tier (read from the previous tier and written atomically).",
    ["tier"],
)
BYTES_SEALED = Counter(
    "tierpoint_worker_bytes_sealed",
    "Bytes read back from the local tier to seal checkpoints.",
    ["tier"],
)
SHARDS_VERIFIED = Counter(
    "tierpoint_worker_shards_verified",
    "Shard replicas read back from their tier and found to match the registered checksum.",
    ["tier"],
)
CORRUPT_FOUND = Counter(
    "tierpoint_worker_corrupt_replicas",
    "Shard replicas whose bytes did not match the registered size or checksum.",
    ["tier"],
)
ACTIVITY_SECONDS = Histogram(
    "tierpoint_worker_activity_seconds",
    "Wall time of lifecycle activities, by activity and outcome.",
    ["activity", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200),
)


@contextmanager
def timed(activity: str) -> Iterator[None]:
    start = time.monotonic()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        ACTIVITY_SECONDS.labels(activity, outcome).observe(time.monotonic() - start)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics of this worker process on host:port."""
    start_http_server(port, addr=host)
