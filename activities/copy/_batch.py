"""One source's shards copied to the destination and read back there, one shard deep (the
pipeline the package describes), with what each copy found recorded on the batch's reporter."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tierpoint import metrics_worker as metrics
from tierpoint.catalog.checkpoint.shards import BatchShard
from tierpoint.catalog.replica.machine import ReplicaWrite
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.errors import UnsafePath
from tierpoint.states import ReplicaState
from tierpoint.storage.base import (
    ChecksumMismatch,
    ResumeState,
    ShardRef,
    ShardSource,
    SourceSizeMismatch,
    TierStore,
    VerifyResult,
)
from tierpoint.storage.peer_http import PeerSource
from tierpoint.tier_config import TierConfig

from ..progress import BatchReporter, resume_state_for

HEARTBEAT_WHILE_WAITING = 5.0
# A copy whose read-back does not match, from a source that read back right, was damaged on its
# way to or on the destination: written again this many times before it counts as corrupt.
RECOPIES_AFTER_BAD_READ_BACK = 2
# A shard read off a peer's data endpoint whose bytes do not match is read again whole this many
# times: a flip in transit (past TCP's weak checksum, or in a middlebox) is not the source's fault.
REREADS_AFTER_TRANSIT_MISMATCH = 2


@dataclass(frozen=True)
class _Mismatch:
    """Bytes written from the source that are not the registered ones, and the file written."""

    reason: str
    written: str | None


@dataclass(frozen=True)
class _ReadBack:
    result: VerifyResult
    seconds: float  # how long the read took


def _read_back(store: TierStore, ref: ShardRef, size: int, crc32c: str) -> _ReadBack:
    """The destination's verification, timed: a restore reads the same bytes the same way."""
    began = time.monotonic()
    v = store.verify(ref, size, crc32c)
    return _ReadBack(v, time.monotonic() - began)


@dataclass
class _Pending:
    shard: BatchShard
    location: str
    verify: Future[_ReadBack]


@dataclass
class BatchCopy:
    job: str
    step: int
    src_tier: TierConfig
    dst_tier: TierConfig
    src: ShardSource
    dst: TierStore
    dst_node: str | None
    reporter: BatchReporter
    result: BatchResult
    heartbeat_details: dict[str, Any]
    attempt: int
    branch: int = 1  # the job's branch it was saved on: its directory on every tier
    resumed: list[dict[str, object]] = field(default_factory=list)
    # Shards written again after a bad read-back: {"path", "reason"} per rewrite.
    recopied: list[dict[str, object]] = field(default_factory=list)
    # Shards this copy verified on the destination (the batch's result counts every source's).
    verified: int = 0
    _pending: _Pending | None = None

    def run(self, shards: list[BatchShard]) -> None:
        with self._verifier() as verifier:
            for sh in shards:
                self._copy_one(sh, verifier)
                self.reporter.flush_if_due()
            self._settle(verifier)

    @contextmanager
    def _verifier(self) -> Iterator[ThreadPoolExecutor]:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierpoint-verify")
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- outcomes (always on the activity's thread) ------------------------------------------

    def _note(self, path: str, reason: str) -> None:
        if len(self.result.problems) < PROBLEM_EXAMPLES:
            self.result.problems.append(f"{path}: {reason}")

    def _verified(self, sh: BatchShard, location: str, identity: str | None) -> None:
        self.reporter.replica(
            ReplicaWrite(
                sh.id,
                ReplicaState.VERIFIED,
                location,
                self.dst_node,
                bytes_done=sh.size,
                identity=identity,
            )
        )
        self.result.verified += 1
        self.verified += 1
        metrics.BYTES_VERIFIED.labels(self.dst_tier.name).inc(sh.size)

    def _corrupt(
        self, sh: BatchShard, location: str, reason: str, identity: str | None = None
    ) -> None:
        self.reporter.replica(
            ReplicaWrite(sh.id, ReplicaState.CORRUPT, location, self.dst_node, 0, reason, identity)
        )
        self.result.corrupt += 1
        metrics.CORRUPT_FOUND.labels(self.dst_tier.name).inc()
        self._note(sh.path, reason)

    def _not_copied(self, sh: BatchShard, location: str, reason: str) -> None:
        self.reporter.replica(
            ReplicaWrite(sh.id, ReplicaState.PENDING, location, self.dst_node, 0, reason)
        )
        self._note(sh.path, reason)

    def _source_bad(
        self,
        sh: BatchShard,
        ref: ShardRef,
        location: str,
        why: str,
        written: str | None = None,
    ) -> None:
        """What was read off the source is not what was registered: the source replica is
        corrupt, and what this copy wrote from it (`written`: the file it committed, None when
        it committed none) must not be taken for a copy."""
        self.reporter.corrupt_on(self.src_tier.name, sh.id, why)
        self.result.source_damaged += 1
        metrics.CORRUPT_FOUND.labels(self.src_tier.name).inc()
        self.dst.cleanup_partial(ref, None)
        self.dst.delete(ref, written)
        self._corrupt(sh, location, f"source corrupt: {why}")

    def _settle(self, verifier: ThreadPoolExecutor) -> None:
        """Wait for the read-back of the previous shard and record it; a bad one is written again
        from the source (which read back right) and read back again, a bounded number of times,
        so a copy damaged in transit or on the destination is replaced, never promoted."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        sh, location = pending.shard, pending.location
        # guard: copy-readback
        v = self._wait(pending.verify, sh.ordinal)
        for _ in range(RECOPIES_AFTER_BAD_READ_BACK):
            if v.ok:
                break
            reason = f"read back from {self.dst_tier.name}: {v.reason or 'mismatch'}"
            self.recopied.append({"path": sh.path, "reason": reason})
            ref = ShardRef(self.job, self.step, sh.path, self.branch)
            if not self._write(sh, ref, location, None):
                return
            check = verifier.submit(_read_back, self.dst, ref, sh.size, str(sh.checksum).lower())
            v = self._wait(check, sh.ordinal)
        if v.ok:
            self._verified(sh, location, v.identity)
        else:
            reason = f"read back from {self.dst_tier.name}: {v.reason or 'mismatch'}"
            metrics.VERIFICATION_FAILURES.labels(self.dst_tier.name).inc()
            self._corrupt(sh, location, reason, v.identity)

    def _wait(self, fut: Future[_ReadBack], ordinal: int) -> VerifyResult:
        """A read-back of a large shard takes long: keep heartbeating while it runs. A good one
        read without a bandwidth limit counts for the tier's read throughput (a limit would
        measure itself). It ran beside the next shard's copy, so it errs slow."""
        while True:
            try:
                done = fut.result(timeout=HEARTBEAT_WHILE_WAITING)
            except TimeoutError:
                self.reporter.heartbeat(ordinal)
                continue
            v = done.result
            if v.ok and v.size and self.dst_tier.read_bandwidth_limit <= 0:
                self.reporter.read_back(v.size, done.seconds)
            return v

    # -- one shard ---------------------------------------------------------------------------

    def _copy_one(self, sh: BatchShard, verifier: ThreadPoolExecutor) -> None:
        ref = ShardRef(self.job, self.step, sh.path, self.branch)
        location = self.dst.location(ref)
        resume = resume_state_for(self.heartbeat_details, sh.ordinal)
        # Carry the previous attempt's resume point: an attempt that fails before its own first
        # progress (S3 or the catalog still down) must not leave the next one nothing to resume.
        self.reporter.heartbeat(sh.ordinal, resume)
        if sh.source_state != ReplicaState.VERIFIED:
            # The source tier was promoted, so only a later change to the catalog gets here: the
            # shard stays unverified and the promotion names it.
            src = self.src_tier.name
            self._not_copied(
                sh, location, f"no verified source replica on {src} ({sh.source_state})"
            )
            if sh.source_state == ReplicaState.CORRUPT:
                # Found by an earlier attempt that may not have lived to say so.
                self.result.source_damaged += 1
            return
        if not sh.checksum:
            self._not_copied(sh, location, "no registered or sealed checksum")
            return
        registered = sh.checksum.lower()

        # An earlier attempt may have committed this shard and died before the catalog heard of
        # it: reading it back is cheaper than copying it again.
        committed = resume is None and self.attempt > 1 and self.dst.size(ref) == sh.size
        if committed:
            check = verifier.submit(_read_back, self.dst, ref, sh.size, registered)
            found = self._wait(check, sh.ordinal)
            if found.ok:
                self._verified(sh, location, found.identity)
                return
        if resume is not None:
            self.resumed.append({"path": sh.path, "offset": resume.offset})
        if not self._write(sh, ref, location, resume):
            return
        self._settle(verifier)
        self._pending = _Pending(
            sh, location, verifier.submit(_read_back, self.dst, ref, sh.size, registered)
        )

    def _write(
        self, sh: BatchShard, ref: ShardRef, location: str, resume: ResumeState | None
    ) -> bool:
        """Copy the shard from the source (from `resume` on), checksumming what is read. False
        when it could not be written right; the outcome is recorded then.

        Bytes that do not match, read off the node's own tier, condemn the source. Read off a
        peer's data endpoint they may have been damaged on the way: the shard is read again
        whole, a bounded number of times, and the source, which this node cannot read back, is
        left to its own node's checks; the copy alone is given up if no read matches."""
        # guard: peer-transit-mismatch-spares-source
        remote = isinstance(self.src, PeerSource)
        why = ""
        for _ in range(1 + (REREADS_AFTER_TRANSIT_MISMATCH if remote else 0)):
            outcome = self._write_once(sh, ref, location, resume)
            if isinstance(outcome, bool):
                return outcome
            if not remote:
                self._source_bad(sh, ref, location, outcome.reason, outcome.written)
                return False
            why = outcome.reason
            self.recopied.append({"path": sh.path, "reason": f"read over the network: {why}"})
            self.dst.cleanup_partial(ref, None)
            self.dst.delete(ref, outcome.written)
            resume = None
        metrics.VERIFICATION_FAILURES.labels(self.dst_tier.name).inc()
        self._corrupt(
            sh,
            location,
            f"no read of {self.src_tier.name} over the network matched "
            f"({REREADS_AFTER_TRANSIT_MISMATCH + 1} reads, damaged in transit or at the source): "
            f"{why}",
        )
        return False

    def _write_once(
        self, sh: BatchShard, ref: ShardRef, location: str, resume: ResumeState | None
    ) -> bool | _Mismatch:
        """One read of the source into the destination: True when it matched, False when it
        failed and the outcome is recorded, else why its bytes are not the registered ones."""
        registered = str(sh.checksum).lower()
        start = resume.offset if resume else 0
        try:
            reader = self.src.open_read(ref, start)
        except (FileNotFoundError, UnsafePath) as exc:
            # Gone, or replaced by something leading out of the root, since it was verified.
            self._source_bad(sh, ref, location, f"cannot read from {self.src_tier.name}: {exc}")
            return False
        try:
            with reader:
                copied = self.dst.write(
                    ref,
                    reader,
                    sh.size,
                    resume,
                    functools.partial(self.reporter.progress, sh.id, sh.ordinal),
                )
        except SourceSizeMismatch as exc:
            self._source_bad(sh, ref, location, str(exc))
            return False
        except (ChecksumMismatch, UnsafePath) as exc:
            # The destination refused what it received (bad in transit), or cannot hold this
            # path: the shard stays unverified there and the tier's promotion names it.
            self.dst.cleanup_partial(ref, None)
            self._corrupt(sh, location, f"write to {self.dst_tier.name}: {exc}")
            return False
        except OSError as exc:
            # The destination cannot take it now (full, over quota, read-only): the activity
            # fails and is retried. The reason reaches the catalog first, so the operator views
            # show why the copy waits instead of only the worker's log.
            self.reporter.replica(
                ReplicaWrite(
                    sh.id,
                    ReplicaState.COPYING,
                    location,
                    self.dst_node,
                    error=f"write to {self.dst_tier.name}: {exc}",
                )
            )
            self.reporter.flush()
            raise
        self.result.bytes += sh.size - start
        metrics.BYTES_COPIED.labels(self.dst_tier.name).inc(sh.size - start)
        # guard: copy-source-crc
        if copied.crc32c != registered or copied.size != sh.size:
            return _Mismatch(
                f"read {copied.size} bytes with crc32c {copied.crc32c} from "
                f"{self.src_tier.name}, registered {sh.size} bytes with crc32c {registered}",
                copied.identity,
            )
        return True
