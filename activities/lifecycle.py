"""The lifecycle activities: plan, seal, copy+verify and promote a checkpoint, batch by batch.

Activities are sync (blocking file and socket I/O) and run in the worker's thread pool. Every one
may run twice: replicas are upserted, verified ones are skipped, state changes are conditional and
stores write under a temporary name before renaming. Bad bytes are an outcome reported in the
result (and the catalog), never an exception, so they are not retried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tierpoint import logs
from tierpoint import metrics_worker as metrics
from tierpoint.catalog.checkpoint.shards import batch_checkpoint, batch_shards
from tierpoint.catalog.engine import Session, Sessions
from tierpoint.catalog.events import EventKind, record_together
from tierpoint.catalog.holds import rebuild
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads import metrics as metric_reads
from tierpoint.catalog.tier_copy.promotion import ACTOR, promote
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import (
    COPY_BATCH,
    PLAN,
    PROMOTE,
    SEAL_BATCH,
    Batch,
    BatchResult,
    CopyInput,
    LifecyclePlan,
    PlanInput,
    PromoteInput,
    PromoteResult,
    SealInput,
)
from tierpoint.errors import UnknownTier, UnsafePath
from tierpoint.states import ReplicaState, TierState
from tierpoint.storage.base import ShardSource, TierStore
from tierpoint.storage.peer_http import PeerSource, pull_tls
from tierpoint.storage.s3.layout import KeyLayout
from tierpoint.tier_config import TierConfig, TierKind

from . import observe
from .copy import Destination, Source, copy_to, mark_copying
from .planning import plan_lifecycle
from .progress import BatchReporter, resume_details
from .registration import on_node_queue
from .seal import BatchSeal
from .stores import Stores, ensure_reachable
from .tier_reads import TierReads

log = logs.get(__name__)


@contextmanager
def _non_retryable_input_errors() -> Iterator[None]:
    """Input that can never work (an unsafe path, a tier not configured) fails at once, without
    retries."""
    try:
        yield
    except UnsafePath as exc:
        raise ApplicationError(str(exc), type=FailureType.UNSAFE_PATH, non_retryable=True) from exc
    except UnknownTier as exc:
        raise ApplicationError(str(exc), type=FailureType.UNKNOWN_TIER, non_retryable=True) from exc


class LifecycleActivities:
    """Built once per worker. `node` is the node this worker serves (None: the shared worker);
    activities that touch a local tier refuse batches of other nodes."""

    def __init__(
        self,
        sessions: Sessions,
        settings: Settings,
        stores: Stores,
        node: str | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node
        self._reads = TierReads()

    def _refuse_lost_node(self, s: Session, batch_node: str, *tiers: TierConfig) -> None:
        """Work on a node declared lost never succeeds: its local tier is gone for good, even if
        a worker still answers its queue."""
        if not any(t.on_nodes for t in tiers):
            return
        if registry.is_lost(s, batch_node):
            raise ApplicationError(
                f"node {batch_node} was declared lost",
                type=FailureType.NODE_LOST,
                non_retryable=True,
            )

    def _store(
        self, tier: TierConfig, batch_node: str, layout: KeyLayout | None = None
    ) -> TierStore:
        ensure_reachable(tier, batch_node, self._node)
        return self._stores.get(tier, batch_node, layout)

    # ---------------------------------------------------------------- plan

    @activity.defn(name=PLAN)
    def plan(self, inp: PlanInput) -> LifecyclePlan:
        with metrics.timed(PLAN):
            return plan_lifecycle(self._sessions, self._settings, inp)

    # ---------------------------------------------------------------- seal

    @on_node_queue
    @activity.defn(name=SEAL_BATCH)
    def seal_batch(self, inp: SealInput) -> BatchResult:
        with (
            metrics.timed(SEAL_BATCH),
            logs.checkpoint_context(job=inp.job, step=inp.step, tier=inp.tier, node=inp.batch.node),
            _non_retryable_input_errors(),
        ):
            return self._seal(inp)

    def _seal(self, inp: SealInput) -> BatchResult:
        """Two transactions whatever the batch holds: one reads it, one records what the seal
        found with its events (more only when the seal outlasts the reporter's interval)."""
        tier = self._stores.tier(inp.tier)
        b = inp.batch
        store = self._store(tier, b.node)
        with self._sessions.begin() as s:
            self._refuse_lost_node(s, b.node, tier)
            shards = batch_shards(s, inp.checkpoint_id, b.node, b.first, b.last, tier.name)
            checkpoint = batch_checkpoint(s, inp.checkpoint_id)
        result = BatchResult(shards=len(shards))
        reporter = self._reporter(inp.checkpoint_id, tier.name)
        BatchSeal(
            job=inp.job,
            step=inp.step,
            tier=tier,
            store=store,
            node=b.node if tier.kind is TierKind.LOCAL else None,
            reporter=reporter,
            result=result,
            branch=checkpoint.branch,
        ).run(shards)
        with self._sessions.begin() as s:
            reporter.finish(s)
            self._batch_events(s, inp.checkpoint_id, checkpoint.job_id, tier.name, b, result)
        metrics.BYTES_SEALED.labels(tier.name).inc(result.bytes)
        metrics.SHARDS_VERIFIED.labels(tier.name).inc(result.verified - result.skipped)
        metrics.CORRUPT_FOUND.labels(tier.name).inc(result.corrupt)
        observe.batch("batch sealed", result)
        return result

    def _reporter(self, checkpoint_id: int, tier: str) -> BatchReporter:
        return BatchReporter(
            self._sessions,
            checkpoint_id,
            tier,
            self._settings.progress_interval_seconds,
            self._reads,
        )

    # ---------------------------------------------------------------- copy + verify

    @on_node_queue
    @activity.defn(name=COPY_BATCH)
    def copy_batch(self, inp: CopyInput) -> BatchResult:
        with (
            metrics.timed(COPY_BATCH),
            logs.checkpoint_context(
                job=inp.job, step=inp.step, tier=inp.destination, node=inp.batch.node
            ),
            _non_retryable_input_errors(),
        ):
            return self._copy(inp)

    def _copy(self, inp: CopyInput) -> BatchResult:
        """Two transactions whatever the batch holds: one reads it and marks every replica
        `copying`, one records what the copy found with its events (more only when the copy
        outlasts the reporter's interval)."""
        info = activity.info()
        b = inp.batch
        src_tier = self._stores.tier(inp.source)
        dst_tier = self._stores.tier(inp.destination)
        reporter = self._reporter(inp.checkpoint_id, dst_tier.name)
        with self._sessions.begin() as s:
            checkpoint = batch_checkpoint(s, inp.checkpoint_id)
            src, dst, dst_node = self._ends(s, inp, src_tier, dst_tier, checkpoint.layouts)
            shards = batch_shards(
                s, inp.checkpoint_id, b.node, b.first, b.last, dst_tier.name, src_tier.name
            )
            result = BatchResult(shards=len(shards))
            todo = [sh for sh in shards if sh.state != ReplicaState.VERIFIED]
            result.skipped = result.verified = len(shards) - len(todo)
            dest = Destination(
                job=inp.job,
                step=inp.step,
                tier=dst_tier,
                store=dst,
                node=dst_node,
                reporter=reporter,
                result=result,
                heartbeat_details=resume_details(info.heartbeat_details),
                attempt=info.attempt,
                branch=checkpoint.branch,
            )
            source = Source(src_tier, src, todo)
            mark_copying(dest, [source])
            reporter.write(s)
        started = time.monotonic()
        (copy,) = copy_to(dest, [source])
        metrics.observe_copy(dst_tier.name, result.bytes, time.monotonic() - started)
        extra = {"source": src_tier.name, "attempt": info.attempt, "resumed": copy.resumed}
        if copy.recopied:
            extra["recopied"] = copy.recopied
        with self._sessions.begin() as s:
            reporter.finish(s)
            self._batch_events(
                s, inp.checkpoint_id, checkpoint.job_id, dst_tier.name, b, result, extra
            )
        metrics.SHARDS_VERIFIED.labels(dst_tier.name).inc(result.verified - result.skipped)
        observe.batch("batch copied and verified", result, source=src_tier.name)
        return result

    def _ends(
        self,
        s: Session,
        inp: CopyInput,
        src_tier: TierConfig,
        dst_tier: TierConfig,
        layouts: dict[str, KeyLayout],
    ) -> tuple[ShardSource, TierStore, str | None]:
        """The batch's source and destination stores (each naming objects in the layout the
        catalog recorded for the checkpoint's copy there), and the node of the destination's
        replicas (None off the nodes), refusing a node declared lost."""
        b = inp.batch
        if dst_tier.kind is not TierKind.PEER:
            self._refuse_lost_node(s, b.node, src_tier, dst_tier)
            src = self._store(src_tier, b.node, layouts.get(src_tier.name))
            dst = self._store(dst_tier, b.node, layouts.get(dst_tier.name))
            return src, dst, b.node if dst_tier.kind is TierKind.LOCAL else None
        # Maybe a re-replication's batch: it renews the hold on what it reads from.
        rebuild.renew(s, inp.checkpoint_id)
        # Runs on the holder's queue and pulls the copy over its node's endpoint.
        if b.holder is None or b.holder == b.node:
            raise ApplicationError(
                f"a copy to peer tier {dst_tier.name} needs a holder other than {b.node}",
                type=FailureType.WRONG_NODE,
                non_retryable=True,
            )
        peer = self._store(dst_tier, b.holder)
        self._refuse_lost_node(s, b.holder, dst_tier)
        if not src_tier.on_nodes:  # re-replication from the shared tier or S3, as repair reads
            return self._store(src_tier, b.node, layouts.get(src_tier.name)), peer, b.holder
        # The shards' node's local copy, or another peer tier's copy on its holder
        # (re-replication), over that node's endpoint.
        serving = b.source_node or b.node
        self._refuse_lost_node(s, serving, src_tier)
        return self._peer_source(s, src_tier, serving), peer, b.holder

    def _peer_source(self, s: Session, tier: TierConfig, node: str) -> PeerSource:
        url = registry.data_urls(s, [node]).get(node)
        if url is None:
            # Retried: the node's worker may be restarting, and reports its endpoint when up.
            raise ApplicationError(f"node {node} serves no data endpoint", type="NoDataEndpoint")
        token = self._settings.data_token
        tls = pull_tls(self._settings) if url.startswith("https:") else None
        return PeerSource(url, tier.name, token.get_secret_value() if token else None, tls)

    # ---------------------------------------------------------------- promote

    @activity.defn(name=PROMOTE)
    def promote(self, inp: PromoteInput) -> PromoteResult:
        with metrics.timed(PROMOTE), self._sessions.begin() as s:
            # In the promoting transaction, so that its age is the tier copy's lag (below).
            found = metric_reads.head_and_age(s, inp.checkpoint_id)
            head = found[0] if found is not None else None
            # A coded tier's copy is promoted through its stripes' coverage.
            code = next((t.stripe_code for t in self._settings.tiers if t.name == inp.tier), None)
            outcome = promote(
                s, inp.checkpoint_id, inp.tier, inp.later_tiers, inp.stage_error, code
            )
            # Only for the first promotion (a repair's is not a promotion lag).
            lag = (
                found[1]
                if found is not None
                and outcome.first
                and outcome.state == TierState.RESTORABLE.value
                else None
            )
        observe.promotion(head, inp.tier, outcome, lag)
        return PromoteResult(tier=inp.tier, state=outcome.state, reason=outcome.reason)

    # ---------------------------------------------------------------- events

    def _batch_events(
        self,
        s: Session,
        checkpoint_id: int,
        job_id: int | None,
        tier: str,
        batch: Batch,
        result: BatchResult,
        copied: dict[str, object] | None = None,
    ) -> None:
        """One event per batch (and one more each for what a copy verified and for corruption
        found), never one per shard, in one statement. `copied`: a copy's own detail (a seal's
        batch is None)."""
        kind = EventKind.SEALED if copied is None else EventKind.COPIED
        detail: dict[str, object] = {
            "node": batch.node,
            "first": batch.first,
            "last": batch.last,
            "shards": result.shards,
            "verified": result.verified,
            "skipped": result.skipped,
            "corrupt": result.corrupt,
            "bytes": result.bytes,
            **(copied or {}),
        }
        events: list[tuple[EventKind, dict[str, object]]] = [(kind, detail)]
        if kind is EventKind.COPIED and result.verified > result.skipped:
            events.append(
                (
                    EventKind.VERIFIED,
                    {"node": batch.node, "verified": result.verified - result.skipped},
                )
            )
        if result.corrupt:
            events.append(
                (EventKind.CORRUPT, {"count": result.corrupt, "examples": result.problems})
            )
        record_together(
            s, events, checkpoint_id=checkpoint_id, job_id=job_id, tier=tier, actor=ACTOR
        )
