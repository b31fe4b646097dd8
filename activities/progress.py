"""Heartbeats and catalog writes of a batch activity, at a bounded rate.

Replica states and bytes-done of a batch accumulate here and reach the catalog in one transaction
at most every `interval` seconds, so a batch of 500 tiny shards costs a handful of round trips,
not 500. The first writes (every replica `copying`) and the last (every outcome) go out in the
batch activity's own transactions, the one that read the batch and the one that records its
events, so a batch that takes less than `interval` costs two transactions in all.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from temporalio import activity

from activities.tier_reads import TierReads
from tierpoint.catalog.checkpoint.shards import fill_checksums
from tierpoint.catalog.engine import Session, Sessions
from tierpoint.catalog.replica.machine import ReplicaWrite, set_bytes_done, upsert_replicas
from tierpoint.catalog.tier_copy.damage import mark_damaged_shards
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ResumeState


def resume_details(details: Any) -> dict[str, Any]:
    """The last heartbeat of a previous attempt, or {}."""
    if details and isinstance(details[-1], dict):
        return dict(details[-1])
    return {}


def resume_state_for(details: dict[str, Any], ordinal: int) -> ResumeState | None:
    """Where the previous attempt was in this shard, if it was in this shard."""
    if details.get("ordinal") != ordinal or int(details.get("offset") or 0) <= 0:
        return None
    return ResumeState(
        offset=int(details["offset"]),
        crc=int(details.get("crc") or 0),
        upload_id=details.get("upload_id"),
        extra=dict(details.get("extra") or {}),
    )


class BatchReporter:
    def __init__(
        self,
        sessions: Sessions,
        checkpoint_id: int,
        tier: str,
        interval: float,
        reads: TierReads,
    ) -> None:
        self._sessions = sessions
        self._reads = reads
        self._checkpoint_id = checkpoint_id
        self._tier = tier
        self._interval = interval
        self._last_flush = time.monotonic()
        self._writes: list[ReplicaWrite] = []
        self._bytes_done: dict[int, int] = {}
        self._corrupt_elsewhere: dict[str, dict[int, str]] = {}
        self._checksums: dict[int, str] = {}
        # Whole shards read back off this tier at full speed: (bytes, seconds), added to the
        # tier's read throughput once, at the end of the batch (`finish`), not per flush.
        self._read_bytes = 0
        self._read_seconds = 0.0

    def heartbeat(self, ordinal: int | None, state: ResumeState | None = None) -> None:
        # The tier it writes: a checkpoint's copies run at once, and its pending activities (what
        # an operator or a test sees in Temporal) say which copy each is by this alone.
        details: dict[str, Any] = {"ordinal": ordinal, "tier": self._tier}
        if state is not None:
            details.update(asdict(state))
        activity.heartbeat(details)

    def progress(self, shard_id: int, ordinal: int, state: ResumeState) -> None:
        self.heartbeat(ordinal, state)
        self._bytes_done[shard_id] = state.offset
        self.flush_if_due()

    def replica(self, write: ReplicaWrite) -> None:
        self._writes.append(write)
        self._bytes_done.pop(write.shard_id, None)

    def corrupt_on(self, tier: str, shard_id: int, error: str) -> None:
        self._corrupt_elsewhere.setdefault(tier, {})[shard_id] = error

    def checksum(self, shard_id: int, crc32c: str) -> None:
        self._checksums[shard_id] = crc32c

    def read_back(self, nbytes: int, seconds: float) -> None:
        """A shard read back whole from this tier's device (a seal's checksum, a copy's
        verification) without a bandwidth limit: the tier's read throughput, which predicts
        how long a restore from it takes (the jobs overview)."""
        self._read_bytes += nbytes
        self._read_seconds += seconds

    def flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self._interval:
            self.flush()

    def _pending(self) -> bool:
        return bool(self._checksums or self._writes or self._bytes_done or self._corrupt_elsewhere)

    def flush(self) -> None:
        """What is pending, in a transaction of its own; none when nothing is (the writes went
        out with the batch's reads, or nothing changed since the last flush)."""
        if not self._pending():
            self._last_flush = time.monotonic()
            return
        with self._sessions.begin() as s:
            self.write(s)

    def write(self, s: Session) -> None:
        """What is pending, in the caller's transaction: a batch's first writes go out with the
        reads that planned them, its last with its events (a round trip and a commit each is
        what a batch of tiny shards costs; docs/architecture.md, "Cost per checkpoint")."""
        fill_checksums(s, self._checksums)
        upsert_replicas(s, self._checkpoint_id, self._tier, self._writes)
        set_bytes_done(s, self._tier, self._bytes_done)
        for tier, errors in self._corrupt_elsewhere.items():
            # That tier was promoted on bytes that have gone bad since: the same finding as a
            # scrub's, with the same outcome (its tier copy demoted, so readers skip it and
            # repair copies it again).
            # guard: copy-source-found-corrupt-demotes
            mark_damaged_shards(s, tier, errors, ReplicaState.CORRUPT, f"copy to {self._tier}")
        self._checksums.clear()
        self._writes.clear()
        self._bytes_done.clear()
        self._corrupt_elsewhere.clear()
        self._last_flush = time.monotonic()

    def finish(self, s: Session) -> None:
        """The batch's last writes, with what its reads measured, in the caller's transaction
        (the one that records the batch's events)."""
        self.write(s)
        self._reads.record(s, self._tier, self._read_bytes, self._read_seconds)
        self._read_bytes, self._read_seconds = 0, 0.0
