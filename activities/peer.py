"""The plan of a peer re-replication: which peer tiers lost copies with a node, which shards they
lack, and the new holder of each shard's node. The copies and promotions are the lifecycle's."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tierpoint.catalog import nodes, peer_reads, rebuild_repo, scrub_repo
from tierpoint.catalog.engine import Sessions
from tierpoint.config import Settings, TierConfig, TierKind
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import Batch, PlanTier
from tierpoint.contract.peer import PLAN, PeerPlan, PeerStage, RereplicateInput

from .batching import batch_size, plan_batches
from .placement import holders_by_tier
from .stores import Stores


def _plan_tier(t: TierConfig) -> PlanTier:
    return PlanTier(name=t.name, kind=t.kind, parallelism=t.parallelism)


class PeerActivities:
    def __init__(
        self, sessions: Sessions, settings: Settings, stores: Stores, node: str | None = None
    ) -> None:
        self._sessions = sessions
        self._settings = settings

    def _source_of(self, tier: TierConfig) -> TierConfig:
        """The local tier a peer tier copies from: the last one before it."""
        tiers = self._settings.tiers
        before = tiers[: tiers.index(tier)]
        return next(t for t in reversed(before) if t.kind is TierKind.LOCAL)

    def _below(self, tier: TierConfig) -> list[str]:
        """The tiers after a peer tier that a holder can read a lost node's shards from, in
        order: off the nodes (a shared tier, S3), readable without a restore request."""
        tiers = self._settings.tiers
        return [
            t.name
            for t in tiers[tiers.index(tier) + 1 :]
            if not t.on_nodes and not t.needs_restore_request
        ]

    @activity.defn(name=PLAN)
    def plan(self, inp: RereplicateInput) -> PeerPlan:
        peers = self._settings.peer_tiers()
        out = PeerPlan(
            checkpoint_id=inp.checkpoint_id,
            job=inp.job,
            step=inp.step,
            batch_heartbeat_seconds=self._settings.batch_heartbeat_timeout_seconds,
        )
        with self._sessions.begin() as s:
            # Under the checkpoint's row lock, as retention's re-check: a copy below that the
            # plan reads is held before any expiry can begin (rebuild_repo).
            if not rebuild_repo.lock_checkpoint(s, inp.checkpoint_id):
                raise ApplicationError(
                    f"checkpoint {inp.checkpoint_id} is not in the catalog",
                    type=FailureType.CHECKPOINT_NOT_FOUND,
                    non_retryable=True,
                )
            failed = peer_reads.tiers_to_rereplicate(s, inp.checkpoint_id, [t.name for t in peers])
            missing = {t: peer_reads.without_verified_copy(s, inp.checkpoint_id, t) for t in failed}
            sources = {n for rows in missing.values() for n, _, _ in rows}
            lost = set(nodes.lost_among(s, sources))
            live = scrub_repo.live_nodes(s)
            domains = nodes.failure_domains(s, [*live, *sources])
            kept = peer_reads.copy_holders(s, inp.checkpoint_id, [t.name for t in peers])
            below = {t.name: self._below(t) for t in peers if t.name in missing}
            held_below = peer_reads.verified_below(
                s, inp.checkpoint_id, sorted(lost), sorted({n for b in below.values() for n in b})
            )
            runs_of = {
                t: _runs_below([r for r in rows if r[0] in lost], below[t], held_below)
                for t, rows in missing.items()
            }
            now = datetime.now(UTC)
            for tier in (t for t in peers if t.name in missing):
                # The tiers this re-replication reads: the shards' nodes' local copies, and the
                # tiers below for shards whose node is lost too.
                reads_local = any(r[0] not in lost for r in missing[tier.name])
                reads = {src for src, _ in runs_of[tier.name]}
                reads |= {self._source_of(tier).name} if reads_local else set()
                rebuild_repo.hold_sources(s, inp.checkpoint_id, tier.name, reads, now)
        out.lost_nodes = sorted(lost)
        # Each source node's new holders, tier by tier: none beside another copy of its shards.
        placing = [t.name for t in peers if t.name in missing]
        new_holders = holders_by_tier(
            {r[0] for rows in missing.values() for r in rows}, live, placing, domains, kept
        )
        for tier in (t for t in peers if t.name in missing):
            rows = missing[tier.name]
            reachable = [r for r in rows if r[0] not in lost]
            runs = runs_of[tier.name]
            holders = new_holders[tier.name]
            batches = self._batches(reachable, tier) + [
                b.model_copy(update={"source_tier": src})
                for src, run in runs
                for b in self._batches(run, tier)
            ]
            out.stages.append(
                PeerStage(
                    tier=_plan_tier(tier),
                    source=_plan_tier(self._source_of(tier)),
                    batches=[
                        b.model_copy(update={"holder": holders[b.node]})
                        for b in batches
                        if b.node in holders
                    ],
                    unreachable=len(rows) - len(reachable) - sum(len(r) for _, r in runs),
                    unplaced=sorted({b.node for b in batches if b.node not in holders}),
                )
            )
        return out

    def _batches(self, rows: list[tuple[str, int, int]], tier: TierConfig) -> list[Batch]:
        return plan_batches(
            rows,
            batch_size(self._settings, len(rows)),
            tier.parallelism,
            self._settings.min_batch_bytes,
        )


Row = tuple[str, int, int]


def _runs_below(
    stranded: list[Row], below: list[str], held: dict[tuple[str, int], set[str]]
) -> list[tuple[str, list[Row]]]:
    """A lost node's shards that a tier below holds verified, as runs of consecutive shards of
    one node read from the same tier (the first below that holds each), so that no two batches'
    ordinal ranges overlap; a shard that no tier below holds is in no run."""
    runs: list[tuple[str, list[Row]]] = []
    last: tuple[str, str] | None = None
    for row in stranded:
        tiers = held.get((row[0], row[1]), set())
        src = next((t for t in below if t in tiers), None)
        if src is None:
            last = None
            continue
        if last != (row[0], src):
            runs.append((src, []))
            last = (row[0], src)
        runs[-1][1].append(row)
    return runs
