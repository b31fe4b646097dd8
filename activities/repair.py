"""Repair activities: plan a repair round, re-copy a batch's damaged shards from the fastest tier
that still holds them verified (through the lifecycle's own copy + verify, `copy.copy_to`), and
ask for repair runs (scrub and reconciliation do, through here).

Promotion is the lifecycle's own `lifecycle.promote`: one home for "restorable only when every
shard is verified on the tier".
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from tierpoint import logs
from tierpoint.catalog.checkpoint.shards import BatchShard, batch_shards, checkpoint_branch
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.holds import rebuild
from tierpoint.catalog.job import lookup
from tierpoint.catalog.job.lookup import checkpoint_head, job_id_of_checkpoint
from tierpoint.catalog.node import registry
from tierpoint.catalog.tier_copy import expiry, key_layouts, repair
from tierpoint.config import Settings
from tierpoint.contract.integrity import (
    REPAIR_COPY,
    REPAIR_PLAN,
    REPAIR_REQUEST,
    RepairCopyInput,
    RepairPlan,
    RepairPlanInput,
    RepairStartInput,
)
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.services import stripe_rebuild
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardSource, TierStore
from tierpoint.storage.peer_http import PeerSource, pull_tls
from tierpoint.storage.s3.layout import KeyLayout
from tierpoint.temporal import request_repair
from tierpoint.tier_config import TierConfig, TierKind

from .batching import batch_size
from .copy import Destination, Source, copy_to, mark_copying
from .progress import BatchReporter, resume_details
from .registration import on_node_queue
from .stores import Stores, ensure_reachable
from .tier_reads import TierReads

log = logs.get(__name__)

ACTOR = "repair"
_UNTOUCHABLE = (
    ReplicaState.VERIFIED.value,
    ReplicaState.EXPIRING.value,
    ReplicaState.EXPIRED.value,
)


class RepairActivities:
    def __init__(
        self,
        sessions: Sessions,
        settings: Settings,
        stores: Stores,
        node: str | None = None,
        client: Client | None = None,
        rebuilds: stripe_rebuild.RebuildRequests | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node
        self._client = client
        self._rebuilds = rebuilds
        self._reads = TierReads()

    def _store(self, tier: TierConfig, batch_node: str, layouts: dict[str, KeyLayout]) -> TierStore:
        ensure_reachable(tier, batch_node, self._node)
        return self._stores.get(tier, batch_node, layouts.get(tier.name))

    def _read_from(self, tier: TierConfig, node: str, layouts: dict[str, KeyLayout]) -> ShardSource:
        """A source tier's reader: a copy on another node (its local copy, a peer copy on its
        holder) through that node's data endpoint, else the store this worker reaches."""
        if tier.on_nodes and node != self._node:
            with self._sessions.begin() as s:
                url = registry.data_urls(s, [node]).get(node)
            if url is None:
                # Retried: the node's worker may be restarting, and reports its endpoint when up.
                raise ApplicationError(
                    f"node {node} serves no data endpoint", type="NoDataEndpoint"
                )
            token = self._settings.data_token
            tls = pull_tls(self._settings) if url.startswith("https:") else None
            return PeerSource(url, tier.name, token.get_secret_value() if token else None, tls)
        return self._store(tier, node, layouts)

    @activity.defn(name=REPAIR_PLAN)
    def plan(self, inp: RepairPlanInput) -> RepairPlan:
        with self._sessions.begin() as s:
            head = checkpoint_head(s, inp.checkpoint_id)
            count = head.shard_count if head is not None else 0
            out = repair.plan_repair(
                s,
                inp.checkpoint_id,
                self._settings.tiers,
                datetime.now(UTC),
                batch_size(self._settings, count or 0),
                inp.limit,
            )
        # A coded copy's stripes found bad are cut again by its rebuild, the one home of a coded
        # copy's redundancy (a lost node's, a scrub's findings): asked for on every attempt.
        for tier in self._settings.tiers:
            if tier.stripe_code is not None:
                # guard: repair-asks-rebuild-of-bad-stripes
                stripe_rebuild.ask_due(
                    self._sessions, self._rebuilds, tier.name, [inp.checkpoint_id]
                )
        return out

    def _source(
        self, src: repair.ShardSources, dst: TierConfig, lost: set[str]
    ) -> TierConfig | None:
        """The fastest tier holding the shard verified that this worker can read: a local tier
        on its own node, or (copying to a peer tier, on the holder) over the shard's node's data
        endpoint, as the lifecycle's peer copy reads it; on a node worker, another peer tier's
        copy over its holder's endpoint; the shared tier, S3."""
        for t in self._settings.tiers:
            if t.name == dst.name or t.name not in src.verified:
                continue
            if t.kind is TierKind.PEER:
                if self._node is None or not repair.reads_peer_copies(dst):
                    continue
                return t
            if t.kind is TierKind.LOCAL:
                if src.node in lost or self._node is None:
                    continue
                if dst.kind is not TierKind.PEER and src.verified[t.name] != self._node:
                    continue
            return t
        return None

    @on_node_queue
    @activity.defn(name=REPAIR_COPY)
    def copy_batch(self, inp: RepairCopyInput) -> BatchResult:
        info = activity.info()
        b = inp.batch
        dst_tier = self._stores.tier(inp.destination)
        # A peer copy is written on its holder (the batch runs on the holder's queue).
        dst_node = b.runs_on if dst_tier.on_nodes else None
        with self._sessions.begin() as s:
            layouts = key_layouts.of_checkpoint(s, inp.checkpoint_id)
            branch = checkpoint_branch(s, inp.checkpoint_id)
        dest = Destination(
            job=inp.job,
            step=inp.step,
            tier=dst_tier,
            store=self._store(dst_tier, b.runs_on, layouts),
            node=dst_node,
            reporter=BatchReporter(
                self._sessions,
                inp.checkpoint_id,
                dst_tier.name,
                self._settings.progress_interval_seconds,
                self._reads,
            ),
            result=BatchResult(),
            heartbeat_details=resume_details(info.heartbeat_details),
            attempt=info.attempt,
            branch=branch,
        )
        found = self._damaged(inp, dst_tier)
        if found is None:
            # Retention (or an operator) took the copy over since the plan: leave it.
            return dest.result
        todo, sources, lost = found
        dest.result.shards = len(todo)
        by_source = self._by_source(dest, b.node, todo, sources, lost, layouts)
        mark_copying(dest, by_source)
        copies = copy_to(dest, by_source)
        used: dict[str, int] = defaultdict(int)
        for c in copies:
            used[c.src_tier.name] += c.verified
        self._record(inp, dest, dict(used), info.attempt)
        return dest.result

    def _damaged(
        self, inp: RepairCopyInput, dst_tier: TierConfig
    ) -> tuple[list[BatchShard], dict[int, repair.ShardSources], set[str]] | None:
        """The batch's shards this worker is to copy again to `dst_tier`, and where each one is
        verified; None when the tier's copy is no longer for repair to mend."""
        b = inp.batch
        with self._sessions.begin() as s:
            tier_copy = expiry.tier_copy_state(s, inp.checkpoint_id, dst_tier.name)
            if tier_copy not in repair.REPAIRABLE:
                return None
            # Renews the hold on the copies this repair reads from (holds/rebuild.py).
            rebuild.renew(s, inp.checkpoint_id)
            shards = batch_shards(s, inp.checkpoint_id, b.node, b.first, b.last, dst_tier.name)
            sources = {
                x.shard_id: x
                for x in repair.shard_sources(s, inp.checkpoint_id)
                if x.node == b.node and b.first <= x.ordinal <= b.last
            }
            lost = registry.lost_nodes(s, [b.node])
            held = (
                repair.peer_holders(s, inp.checkpoint_id, dst_tier.name)
                if dst_tier.kind is TierKind.PEER
                else {}
            )
        todo = [sh for sh in shards if sh.state not in _UNTOUCHABLE]
        if dst_tier.kind is TierKind.PEER:
            # A batch's range of the node's shards may hold some on another node (re-replication
            # moved them): this holder copies only its own.
            todo = [sh for sh in todo if held.get(sh.id) == b.holder]
        elif dst_tier.kind is not TierKind.LOCAL:
            # The plan split the shards between the node's queue (fastest copy local) and the
            # shared one; each worker takes its own share, so no shard is copied twice at once.
            mine = self._node is not None
            tiers = self._settings.tiers
            todo = [sh for sh in todo if repair.prefers_node(sources[sh.id], tiers, lost) == mine]
        return todo, sources, lost

    def _by_source(
        self,
        dest: Destination,
        batch_node: str,
        todo: list[BatchShard],
        sources: dict[int, repair.ShardSources],
        lost: set[str],
        layouts: dict[str, KeyLayout],
    ) -> list[Source]:
        """The shards grouped by the fastest tier this worker can read them from verified; a
        shard with no such tier is left as it is, and said so."""
        # By tier and the node that serves it (a peer copy's holder; else the batch's node).
        groups: dict[tuple[str, str], list[BatchShard]] = defaultdict(list)
        for sh in todo:
            src_tier = self._source(sources[sh.id], dest.tier, lost)
            if src_tier is None:
                if len(dest.result.problems) < PROBLEM_EXAMPLES:
                    dest.result.problems.append(
                        f"{sh.path}: no verified source this worker can read"
                    )
                continue
            at = sources[sh.id].verified[src_tier.name] if src_tier.kind is TierKind.PEER else None
            # Verified on the tier it is copied from: that is what the source was chosen for.
            groups[(src_tier.name, at or batch_node)].append(
                dataclasses.replace(sh, source_state=ReplicaState.VERIFIED.value)
            )
        return [
            Source(
                self._stores.tier(name), self._read_from(self._stores.tier(name), at, layouts), g
            )
            for (name, at), g in groups.items()
        ]

    def _record(
        self, inp: RepairCopyInput, dest: Destination, used: dict[str, int], attempt: int
    ) -> None:
        """What the copies found, with the batch's event, in one transaction."""
        b, tier, result = inp.batch, dest.tier, dest.result
        with self._sessions.begin() as s:
            dest.reporter.finish(s)
            record(
                s,
                EventKind.REPAIRED,
                checkpoint_id=inp.checkpoint_id,
                job_id=job_id_of_checkpoint(s, inp.checkpoint_id),
                tier=tier.name,
                actor=ACTOR,
                detail={
                    "node": b.node,
                    "first": b.first,
                    "last": b.last,
                    "repaired": result.verified,
                    "corrupt": result.corrupt,
                    "bytes": result.bytes,
                    "sources": used,
                    "problems": result.problems,
                    "attempt": attempt,
                },
            )

    @activity.defn(name=REPAIR_REQUEST)
    async def request(self, inp: RepairStartInput) -> int:
        """Start (or signal) the repair run of each checkpoint. Returns how many were asked."""
        assert self._client is not None, "repair requests run on the shared worker"

        def names() -> list[tuple[int, str, int, int]]:
            with self._sessions.begin() as s:
                return lookup.checkpoint_names(s, inp.checkpoint_ids)

        rows = await asyncio.to_thread(names)
        for cid, job, step, branch in rows:
            await request_repair(self._client, cid, job, step, inp.reason, branch)
        return len(rows)
