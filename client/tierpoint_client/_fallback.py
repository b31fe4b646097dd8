"""What a restore reads when a copy cannot be read or its bytes do not match: another verified
copy of the shard."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from tierpoint_client.errors import ChecksumMismatchError, SourceError, TierpointError
from tierpoint_client.models import Checkpoint, LatestCheckpoint, PlanEntry, TierInfo

if TYPE_CHECKING:
    from tierpoint_client.client import Client


class Fallback:
    """Another source for a shard whose copy failed: a copy whose bytes did not match is
    reported (one that could not be read is not: a node down, a connection cut say nothing of
    the bytes), then the checkpoint's detail (fetched once, at the first failure) names the
    other verified copies on restorable tiers, fastest first."""

    def __init__(
        self,
        client: Client,
        latest: LatestCheckpoint,
        tiers: dict[str, TierInfo],
        node: str | None,
        only_tier: str | None = None,
    ) -> None:
        self._only_tier = only_tier
        self._client = client
        self._latest = latest
        self._tiers = tiers
        self._node = node
        self._lock = threading.Lock()
        self._detail: Checkpoint | None = None

    def __call__(
        self, entry: PlanEntry, err: SourceError | ChecksumMismatchError, tried: frozenset[str]
    ) -> PlanEntry | None:
        job, step = self._latest.job, self._latest.step
        if isinstance(err, ChecksumMismatchError):
            reason = (
                f"restore read {err.actual_size} bytes with crc32c {err.actual_crc32c} from "
                f"{entry.location}; registered {err.expected_size} bytes, "
                f"crc32c {err.expected_crc32c}"
            )
            with contextlib.suppress(TierpointError):
                self._client.report_corrupt_copy(job, step, entry.tier, entry.path, reason)
        if self._only_tier is not None:
            return None
        with self._lock:
            if self._detail is None:
                self._detail = self._client.checkpoint(job, step)
            detail = self._detail
        restorable = [t.tier for t in detail.tiers if t.state == "restorable"]
        shard = next((s for s in detail.shards or () if s.path == entry.path), None)
        if shard is None:
            return None
        for tier in restorable:
            info = self._tiers.get(tier)
            if tier in tried or info is None:
                continue
            for r in shard.replicas:
                if r.tier != tier or r.state != "verified" or not r.location:
                    continue
                if info.kind == "local" and (self._node is None or r.node != self._node):
                    continue
                return PlanEntry.of_replica(shard, r, info.kind)
        return None
