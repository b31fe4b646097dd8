"""Scrub activities: which units (tier x node) to scrub and with what budget, which replicas are
due, and reading a batch of replicas back (POSIX: from the device, S3: a whole GET with crc32c
over every byte, never the stored checksum) at the tier's scrub bandwidth.

A replica that reads back wrong is marked `corrupt` (missing: `lost`) and its tier copy demoted in
one transaction (`tierpoint/catalog/tier_copy/damage.py`); the result names the checkpoints so the
workflow can ask for their repair. Idempotent: a retried batch resumes at the replica its last
heartbeat named, and a replica already counted for this pick is not counted again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import activity

from tierpoint import logs
from tierpoint.catalog.engine import Sessions, catalog_now
from tierpoint.catalog.node import registry
from tierpoint.catalog.replica import scrub
from tierpoint.catalog.replica.scrub import ScrubTarget
from tierpoint.catalog.stripe import scrub as stripe_scrub
from tierpoint.catalog.tier_copy import key_layouts
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.config import Settings
from tierpoint.contract.integrity import (
    PROBLEM_LIMIT,
    SCRUB_BATCH,
    SCRUB_PICK,
    SCRUB_PLAN,
    VERIFY_PICK,
    ScrubBatchInput,
    ScrubBatchResult,
    ScrubPick,
    ScrubPickInput,
    ScrubPlan,
    ScrubUnit,
    VerifyBatch,
    VerifyPick,
    VerifyPickInput,
)
from tierpoint.errors import UnsafePath
from tierpoint.services import stripe_rebuild
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore, VerifyResult
from tierpoint.storage.throttle import TokenBucket

from .registration import on_node_queue
from .scrub_stripes import scrub_stripes
from .stores import Stores, ensure_reachable
from .tier_reads import TierReads

log = logs.get(__name__)


def judge(v: VerifyResult, size: int, checksum: str, tier: str) -> tuple[ReplicaState, str | None]:
    """What a read-back says about a replica: (state it deserves, why) or (verified, None)."""
    if v.size is None:
        return ReplicaState.LOST, f"missing on {tier}"
    if v.size != size:
        return ReplicaState.CORRUPT, f"size {v.size} != registered {size}"
    if v.crc32c != checksum.lower():
        return (
            ReplicaState.CORRUPT,
            f"crc32c {v.crc32c} != registered {checksum.lower()} (read back)",
        )
    return ReplicaState.VERIFIED, None


class ScrubActivities:
    def __init__(
        self,
        sessions: Sessions,
        settings: Settings,
        stores: Stores,
        node: str | None = None,
        rebuilds: stripe_rebuild.RebuildRequests | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._rebuilds = rebuilds
        self._stores = stores
        self._node = node
        self._reads = TierReads()
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str | None, int], TokenBucket] = {}

    def _bucket(self, tier: str, node: str | None, rate: int) -> TokenBucket | None:
        """One limiter per tier (and node) in this process: batches of one unit share it."""
        if rate <= 0:
            return None
        key = (tier, node, rate)
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(rate)
            return bucket

    def _ask_rebuild(self, tier: str, checkpoint_ids: Iterable[int]) -> None:
        stripe_rebuild.ask_due(self._sessions, self._rebuilds, tier, checkpoint_ids)

    @activity.defn(name=SCRUB_PLAN)
    def plan(self) -> ScrubPlan:
        s = self._settings
        if not s.scrub_enabled:
            return ScrubPlan()
        interval = s.scrub_interval.total_seconds()
        with self._sessions.begin() as session:
            nodes = registry.serving_nodes(session)
        units = []
        for t in s.tiers:
            if t.scrub_bandwidth <= 0:
                continue
            # A local tier's unit is a node's own copies; a peer tier's, the copies a node holds
            # for other nodes (the replica's node is its holder): each is read on that node.
            for node in nodes if t.on_nodes else [None]:
                units.append(
                    ScrubUnit(
                        tier=t.name,
                        kind=t.kind,
                        node=node,
                        bandwidth=t.scrub_bandwidth,
                        budget=int(t.scrub_bandwidth * interval),
                        min_age_seconds=s.scrub_min_age.total_seconds(),
                    )
                )
        return ScrubPlan(units=units)

    @activity.defn(name=SCRUB_PICK)
    def pick(self, inp: ScrubPickInput) -> ScrubPick:
        coded = self._settings.tier(inp.unit.tier).stripe_code is not None
        with self._sessions.begin() as s:
            now = catalog_now(s)
            cutoff = datetime.fromisoformat(inp.cutoff) if inp.cutoff else now
            if coded and inp.unit.node is not None:
                # A coded tier keeps stripes, not replicas: its holder reads those back.
                ids, nbytes = stripe_scrub.due(
                    s,
                    inp.unit.tier,
                    inp.unit.node,
                    timedelta(seconds=inp.unit.min_age_seconds),
                    cutoff,
                    inp.budget,
                    inp.limit,
                )
                return ScrubPick(stripe_ids=ids, bytes=nbytes, picked_at=cutoff.isoformat())
            ids, nbytes = scrub.due(
                s,
                inp.unit.tier,
                inp.unit.node,
                timedelta(seconds=inp.unit.min_age_seconds),
                cutoff,
                inp.budget,
                inp.limit,
            )
        return ScrubPick(replica_ids=ids, bytes=nbytes, picked_at=cutoff.isoformat())

    @activity.defn(name=VERIFY_PICK)
    def verify_pick(self, inp: VerifyPickInput) -> VerifyPick:
        """The next replicas (a coded tier: stripes) of a checkpoint's copy to verify, one batch
        per node's queue (a peer copy's, a stripe's: its holder's)."""
        tier = self._settings.tier(inp.tier)
        coded = tier.stripe_code is not None
        with self._sessions.begin() as s:
            # A coded tier's copy is its stripes, each read on its holder.
            pick = stripe_scrub.checkpoint_stripes if coded else scrub.checkpoint_replicas
            rows: list[tuple[int, str | None]] = list(
                pick(s, inp.checkpoint_id, inp.tier, inp.after_id, inp.limit)
            )
        by_node: dict[str | None, list[int]] = {}
        for rid, node in rows:
            by_node.setdefault(node if tier.on_nodes else None, []).append(rid)
        return VerifyPick(
            batches=[
                VerifyBatch(node=n, replica_ids=[], stripe_ids=ids)
                if coded
                else VerifyBatch(node=n, replica_ids=ids)
                for n, ids in by_node.items()
            ],
            last_id=rows[-1][0] if rows else inp.after_id,
            more=len(rows) == inp.limit,
        )

    @on_node_queue
    @activity.defn(name=SCRUB_BATCH)
    def verify_batch(self, inp: ScrubBatchInput) -> ScrubBatchResult:
        tier = self._stores.tier(inp.tier)
        ensure_reachable(tier, inp.node, self._node)
        bucket = self._bucket(tier.name, inp.node, inp.bandwidth)
        code = tier.stripe_code
        if inp.stripe_ids and code is not None:
            return scrub_stripes(
                self._sessions,
                self._stores.get(tier, inp.node),
                code,
                inp,
                lambda store, ref, i: _read(store, ref, bucket, i)[:2],
                self._settings.progress_interval_seconds,
                self._ask_rebuild,
            )
        details = activity.info().heartbeat_details
        start = int(details[-1]) if details else 0
        with self._sessions.begin() as s:
            todo = scrub.targets(s, inp.replica_ids)
            layouts = key_layouts.on_tier(s, {t.checkpoint_id for t in todo}, tier.name)
        result = ScrubBatchResult()
        found = _Found(tier.name, datetime.fromisoformat(inp.picked_at), inp.actor, result)
        for i, t in enumerate(todo):
            if i < start:
                continue
            activity.heartbeat(i)
            if t.state != ReplicaState.VERIFIED.value or not t.checksum:
                result.skipped += 1
                continue
            store = self._stores.get(tier, inp.node, layouts.get(t.checkpoint_id))
            state, problem, took, identity = _read_back(store, t, tier.name, bucket, i)
            if problem is None:
                found.good(t, None if bucket is not None else took, identity)
            else:
                found.bad(t, state, problem)
            if found.any_bad():
                # Demoted at once: no reader is sent to bytes known bad.
                found.write(self._sessions, self._reads)
            elif time.monotonic() - found.since >= self._settings.progress_interval_seconds:
                found.write(self._sessions, self._reads)
        found.write(self._sessions, self._reads)
        return result


def _read(
    store: TierStore, ref: ShardRef, bucket: TokenBucket | None, i: int
) -> tuple[VerifyResult | None, str | None, float]:
    """Read a file back from the device at the scrub's bandwidth: (what was read, or None and
    why it was not safe to read, seconds)."""
    seen = 0

    def progress(total: int) -> None:
        nonlocal seen
        if bucket is not None:
            bucket.consume(total - seen)
        seen = total
        activity.heartbeat(i)

    try:
        began = time.monotonic()
        v = store.checksum(ref, progress)
        return v, None, time.monotonic() - began
    except UnsafePath as exc:
        # E.g. a symlink out of the root put in place of the file: not these bytes.
        return None, str(exc), 0.0


def _read_back(
    store: TierStore, t: ScrubTarget, tier: str, bucket: TokenBucket | None, i: int
) -> tuple[ReplicaState, str | None, float, str | None]:
    """Read the replica back at the scrub's bandwidth: (state it deserves, why, seconds, which
    file was read)."""
    assert t.checksum is not None
    v, unsafe, took = _read(store, ShardRef(t.job, t.step, t.path, t.branch), bucket, i)
    if v is None:
        return ReplicaState.CORRUPT, f"unsafe: {unsafe}", 0.0, None
    state, problem = judge(v, t.size, t.checksum, tier)
    return state, problem, took, v.identity


@dataclass
class _Found:
    """What a scrub batch read since its last catalog write, and the batch's result."""

    tier: str
    picked_at: datetime
    actor: str
    result: ScrubBatchResult
    replica_ids: list[int] = field(default_factory=list)
    # The files read back good (replica id -> identity): what an expiry of them will check.
    identities: dict[int, str] = field(default_factory=dict)
    problems: dict[ReplicaState, dict[int, str]] = field(
        default_factory=lambda: {ReplicaState.CORRUPT: {}, ReplicaState.LOST: {}}
    )
    # Unthrottled reads of good replicas: the tier's read throughput (restore predictions).
    read_bytes: int = 0
    read_seconds: float = 0.0
    since: float = field(default_factory=time.monotonic)

    def good(self, t: ScrubTarget, unthrottled_seconds: float | None, identity: str | None) -> None:
        self.replica_ids.append(t.replica_id)
        if identity is not None:
            self.identities[t.replica_id] = identity
        self.result.replicas += 1
        if unthrottled_seconds is not None:
            self.read_bytes += t.size
            self.read_seconds += unthrottled_seconds

    def bad(self, t: ScrubTarget, state: ReplicaState, problem: str) -> None:
        self.problems[state][t.replica_id] = f"{self.actor}: {problem}"
        if state is ReplicaState.LOST:
            self.result.lost += 1
        else:
            self.result.corrupt += 1
        if len(self.result.problems) < PROBLEM_LIMIT:
            self.result.problems.append(f"{t.job}/{t.step}/{t.path}: {problem}")
        log.warning(  # `verify` and the scrub both read here: say which
            f"{self.actor} found a bad replica", tier=self.tier, path=t.path, why=problem
        )

    def any_bad(self) -> bool:
        return any(self.problems.values())

    def write(self, sessions: Sessions, reads: TierReads) -> None:
        result = self.result
        with sessions.begin() as s:
            result.bytes += scrub.record_good(s, self.tier, self.replica_ids, self.picked_at)
            # guard: read-back-records-identity
            scrub.record_identities(s, self.identities)
            reads.record(s, self.tier, self.read_bytes, self.read_seconds)
            for state, problems in self.problems.items():
                damage = mark_damaged(s, problems, state, self.actor)
                result.damaged = sorted(set(result.damaged) | damage.checkpoints)
                scrub.record_bad(
                    s,
                    self.tier,
                    corrupt=damage.marked if state is ReplicaState.CORRUPT else 0,
                    lost=damage.marked if state is ReplicaState.LOST else 0,
                )
        self.replica_ids.clear()
        self.identities.clear()
        self.read_bytes, self.read_seconds = 0, 0.0
        for problems in self.problems.values():
            problems.clear()
        self.since = time.monotonic()
