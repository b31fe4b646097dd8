"""Seal of one batch of shards on the tier the job wrote them to: each shard is checksummed where
it lies and compared with what was registered; a match becomes a verified replica (a shard
registered without a checksum gets the one computed here), anything else a corrupt one.

Bad bytes are an outcome, never an exception: the batch goes on and the promotion names them.
The outcomes wait on the reporter for the activity's last transaction, the one with its events.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from tierpoint import metrics_worker as metrics
from tierpoint.catalog.checkpoint.shards import BatchShard
from tierpoint.catalog.replica.machine import ReplicaWrite
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.errors import UnsafePath
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore, VerifyResult
from tierpoint.tier_config import TierConfig

from .progress import BatchReporter


def _heartbeat_bytes(reporter: BatchReporter, ordinal: int, _bytes_read: int) -> None:
    reporter.heartbeat(ordinal)


def _problem(sh: BatchShard, v: VerifyResult, tier: str) -> str | None:
    """Why the shard as read does not match its registration, or None when it does."""
    if v.size is None:
        return v.reason or f"missing on {tier}"
    if v.size != sh.size:
        return f"size {v.size} != registered {sh.size}"
    if v.crc32c is None:
        return v.reason or "no checksum could be computed"
    # guard: seal-crc
    if sh.checksum is not None and v.crc32c != sh.checksum.lower():
        return f"crc32c {v.crc32c} != registered {sh.checksum}"
    return None


@dataclass
class BatchSeal:
    job: str
    step: int
    tier: TierConfig
    store: TierStore
    node: str | None  # the node of a local tier's replicas
    reporter: BatchReporter
    result: BatchResult
    branch: int = 1  # the job's branch it was saved on: its directory on every tier

    def run(self, shards: list[BatchShard]) -> None:
        for sh in shards:
            if sh.state == ReplicaState.VERIFIED:
                self.result.skipped += 1
                self.result.verified += 1
                continue
            self._seal_one(sh)
            self.reporter.flush_if_due()

    def _seal_one(self, sh: BatchShard) -> None:
        ref = ShardRef(self.job, self.step, sh.path, self.branch)
        self.reporter.heartbeat(sh.ordinal)
        began = time.monotonic()
        try:
            v = self.store.checksum(
                ref, functools.partial(_heartbeat_bytes, self.reporter, sh.ordinal)
            )
        except UnsafePath as exc:
            # E.g. a symlink out of the root, put there after registration: this shard is bad,
            # the rest of the batch is not.
            v = VerifyResult(ok=False, size=None, crc32c=None, reason=f"unsafe: {exc}")
        self.result.bytes += v.size or 0
        problem = _problem(sh, v, self.tier.name)
        location = self.store.location(ref)
        if problem is None:
            if self.tier.read_bandwidth_limit <= 0:
                # Read whole off the device the job wrote to: how fast a restart reads it back.
                self.reporter.read_back(sh.size, time.monotonic() - began)
            if sh.checksum is None:
                assert v.crc32c is not None
                self.reporter.checksum(sh.id, v.crc32c)
            self.reporter.replica(
                ReplicaWrite(
                    sh.id,
                    ReplicaState.VERIFIED,
                    location,
                    self.node,
                    bytes_done=sh.size,
                    # guard: seal-records-identity
                    identity=v.identity,
                )
            )
            self.result.verified += 1
            metrics.BYTES_VERIFIED.labels(self.tier.name).inc(sh.size)
            return
        # No identity: the file is not the one registered, and on a local tier it is the job's
        # (written again since, say). A delete removes a file whose identity the catalog
        # recorded; this one it must judge by its bytes, and keep.
        self.reporter.replica(
            # guard: seal-records-no-identity-of-a-wrong-file
            ReplicaWrite(sh.id, ReplicaState.CORRUPT, location, self.node, 0, problem, None)
        )
        metrics.VERIFICATION_FAILURES.labels(self.tier.name).inc()
        self.result.corrupt += 1
        if len(self.result.problems) < PROBLEM_EXAMPLES:
            self.result.problems.append(f"{sh.path}: {problem}")
