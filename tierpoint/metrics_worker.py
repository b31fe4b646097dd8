"""Prometheus metrics of the workers (copies, verifications, corruption, promotions, activity
durations), on the process's default registry: one set per worker process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from wsgiref.simple_server import WSGIServer

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
BYTES_VERIFIED = Counter(
    "tierpoint_worker_bytes_verified",
    "Bytes of shard replicas read back from a tier (or checked against its stored checksum) and "
    "found to match the registered checksum: seals and copies.",
    ["tier"],
)
SHARDS_VERIFIED = Counter(
    "tierpoint_worker_shards_verified",
    "Shard replicas read back from their tier and found to match the registered checksum.",
    ["tier"],
)
VERIFICATION_FAILURES = Counter(
    "tierpoint_worker_verification_failures",
    "Reads of a replica (seal, read-back after a copy) whose size or checksum did not match "
    "what was registered.",
    ["tier"],
)
CORRUPT_FOUND = Counter(
    "tierpoint_worker_corrupt_replicas",
    "Shard replicas whose bytes did not match the registered size or checksum.",
    ["tier"],
)
STRIPES_SCRUBBED = Counter(
    "tierpoint_worker_stripes_scrubbed",
    "Stripes of a coded peer tier a scrub (or a reader's report) read back on their holder, by "
    "what the read found: good, corrupt (not the encoder's size or crc32c) or lost (missing).",
    ["tier", "result"],
)
DATA_BYTES_SERVED = Counter(
    "tierpoint_worker_data_bytes_served",
    "Bytes of shard files the node's data endpoint sent to peers and restores, by tier.",
    ["tier"],
)
DATA_HANDSHAKES_REFUSED = Counter(
    "tierpoint_worker_data_handshakes_refused",
    "TLS connections to the node's data endpoint refused at the handshake, before any request "
    "was read: by reason (no client certificate, one the CA did not sign, expired, ...).",
    ["reason"],
)
DATA_CONNECTIONS_CUT = Counter(
    "tierpoint_worker_data_connections_cut",
    "Connections the node's data endpoint closed for its limits, by reason: header_timeout (no "
    "complete request in data_header_timeout), idle_timeout (a kept-alive connection or a "
    "response reader idle for data_idle_timeout), evicted (its slot taken at "
    "data_max_connections by a new connection), refused (a new connection at the cap with every "
    "slot answering a request).",
    ["reason"],
)
DATA_COPIES_DAMAGED = Counter(
    "tierpoint_worker_data_copies_damaged",
    "Copies the node's data endpoint found short, long or gone while the catalog listed them "
    "verified: marked bad and sent to repair, by tier.",
    ["tier"],
)
# From a slow HDD array or a throttled NVMe read (MiB/s) to a fast parallel file system (GiB/s).
THROUGHPUT_BUCKETS = tuple(float(2**n) for n in range(20, 35))  # 1 MiB/s .. 16 GiB/s
COPY_THROUGHPUT = Histogram(
    "tierpoint_worker_copy_throughput_bytes_per_second",
    "Bytes copied per second of wall time, one observation per copy batch that copied bytes, by "
    "destination tier.",
    ["tier"],
    buckets=THROUGHPUT_BUCKETS,
)
PROMOTION_LAG = Histogram(
    "tierpoint_worker_promotion_lag_seconds",
    "Registration to restorable on a tier, observed when the promotion makes the tier restorable.",
    ["tier"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
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


def observe_copy(tier: str, nbytes: int, seconds: float) -> None:
    """One batch's throughput; a batch that copied nothing (all verified already) says nothing
    about the link."""
    if nbytes > 0 and seconds > 0:
        COPY_THROUGHPUT.labels(tier).observe(nbytes / seconds)


def serve(port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Expose /metrics of this worker process on host:port (port 0: any free one, see
    `server.server_port`). Stop it with `server.shutdown()`."""
    server, _thread = start_http_server(port, addr=host)
    return server
