"""A worker's reads of whole replicas at full speed (seals, copies' read-backs, verifications,
scrubs), on their way to each tier's read throughput in the catalog (`tier_read_stats`, which
predicts how long a restore from the tier takes).

Every batch adds its reads to its tier's one row in the transaction that ends the batch. Where
another batch's transaction holds that row, the reads are kept here and go with this worker's
next batch of the tier instead of waiting: a throughput is a sum of bytes over a sum of
seconds, so a sample that arrives late changes nothing, while a wait put every batch of a
1,000-node checkpoint in one queue for the row. A sample is lost only with a transaction that
rolls back after adding it or a worker that exits holding it."""

from __future__ import annotations

import threading

from tierpoint.catalog.engine import Session
from tierpoint.catalog.replica import scrub


class TierReads:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, float]] = {}

    def record(self, session: Session, tier: str, nbytes: int, seconds: float) -> None:
        """Add these reads, and any this worker holds for `tier`, to the tier's row in the
        caller's transaction, unless another transaction holds the row: then hold them."""
        with self._lock:
            held_bytes, held_seconds = self._held.pop(tier, (0, 0.0))
        nbytes, seconds = nbytes + held_bytes, seconds + held_seconds
        if nbytes <= 0 or seconds <= 0:
            return
        if scrub.add_reads_unless_busy(session, tier, nbytes, seconds):
            return
        with self._lock:
            more_bytes, more_seconds = self._held.get(tier, (0, 0.0))
            self._held[tier] = (nbytes + more_bytes, seconds + more_seconds)

    def held(self, tier: str) -> tuple[int, float]:
        """The reads of `tier` waiting for a later batch: (bytes, seconds)."""
        with self._lock:
            return self._held.get(tier, (0, 0.0))
