"""The plan of a peer re-replication: which peer tiers lost copies with a node, which shards they
lack, and the new holder of each shard's node. The copies and promotions are the lifecycle's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.holds import rebuild
from tierpoint.catalog.locks import RowLock, lock_checkpoint
from tierpoint.catalog.node import registry
from tierpoint.catalog.replica import placement
from tierpoint.catalog.tier_copy import repair
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import Batch, PlanTier
from tierpoint.contract.peer import PLAN, PeerPlan, PeerStage, RereplicateInput
from tierpoint.tier_config import TierConfig, TierKind

from .batching import batch_size, plan_batches
from .peer_coded import coded_stage
from .placement import holders_by_tier
from .stores import Stores

# A re-replication waits for the checkpoint's lifecycle to place its peer copies (a retryable
# failure of its plan, this often).
PLACING = "PeerCopiesPlacing"
PLACING_RETRY = timedelta(seconds=2)
PLACING_ATTEMPTS = 300


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

    def _readable(self, tier: TierConfig) -> list[str]:
        """The tiers a copy on peer tier `tier` may be made again from, fastest first: the
        shards' nodes' local tiers, the other peer tiers (read from their holders), and the
        tiers off the nodes (a shared tier, S3) that answer without a restore request."""
        return [
            t.name
            for t in self._settings.tiers
            if t is not tier and (t.on_nodes or not t.needs_restore_request)
        ]

    @activity.defn(name=PLAN)
    def plan(self, inp: RereplicateInput) -> PeerPlan:
        # A coded tier's copy is rebuilt stripe by stripe (peer_coded.py), never copied whole.
        every = self._settings.peer_tiers()
        peers = [t for t in every if t.stripe_code is None]
        out = PeerPlan(
            checkpoint_id=inp.checkpoint_id,
            job=inp.job,
            step=inp.step,
            batch_heartbeat_seconds=self._settings.batch_heartbeat_timeout_seconds,
        )
        with self._sessions.begin() as s:
            # Under the checkpoint's row lock, as retention's re-check: a copy that the plan
            # reads is held before any expiry of it can begin (holds/rebuild.py).
            if not lock_checkpoint(s, inp.checkpoint_id, RowLock.NO_KEY_UPDATE):
                raise ApplicationError(
                    f"checkpoint {inp.checkpoint_id} is not in the catalog",
                    type=FailureType.CHECKPOINT_NOT_FOUND,
                    non_retryable=True,
                )
            names = [t.name for t in every]
            placing = placement.placing_peer_copies(s, names, inp.checkpoint_id)
            # guard: rereplication-waits-for-the-lifecycle
            if placing and activity.info().attempt < PLACING_ATTEMPTS:
                # Its lifecycle still places peer copies: copies made now could not see where
                # it puts the others, and might land beside one. Asked again shortly (and at
                # last planned anyway: a lifecycle that stopped leaves its tier copies pending).
                raise ApplicationError(
                    f"checkpoint {inp.checkpoint_id}'s lifecycle is still placing peer copies",
                    type=PLACING,
                    next_retry_delay=PLACING_RETRY,
                )
            failed = repair.tiers_to_rereplicate(s, inp.checkpoint_id, [t.name for t in peers])
            missing = {t: placement.without_verified_copy(s, inp.checkpoint_id, t) for t in failed}
            remade = [t for t in peers if t.name in missing]
            sources = {n for rows in missing.values() for n, _, _ in rows}
            lost = set(registry.lost_among(s, sources))
            serving = registry.serving_nodes(s)
            domains = registry.failure_domains(s, [*serving, *sources])
            kept = placement.copy_holders(s, inp.checkpoint_id, names)
            readable = {t.name: self._readable(t) for t in remade}
            verified = placement.verified_copies(
                s,
                inp.checkpoint_id,
                sorted(sources),
                sorted({n for r in readable.values() for n in r}),
            )
            runs_of = {t: _runs(missing[t], readable[t], verified) for t in missing}
            now = datetime.now(UTC)
            for tier in remade:
                # The copies this re-replication reads, whichever tier each one is on.
                reads = {src for (src, _), _ in runs_of[tier.name]}
                # guard: rereplication-holds-its-sources
                rebuild.hold_sources(s, inp.checkpoint_id, tier.name, reads, now)
            coded = [
                stage
                for t in every
                if t.stripe_code is not None
                and (
                    stage := coded_stage(
                        s,
                        self._settings,
                        inp.checkpoint_id,
                        t,
                        _plan_tier(self._source_of(t)),
                        t.stripe_code,
                    )
                )
                is not None
            ]
        out.lost_nodes = sorted(lost)
        # Each source node's new holders, tier by tier: none beside another copy of its shards.
        new_holders = holders_by_tier(sources, serving, [t.name for t in remade], domains, kept)
        for tier in remade:
            out.stages.append(
                self._stage(tier, missing[tier.name], runs_of[tier.name], new_holders[tier.name])
            )
        out.stages.extend(coded)
        return out

    def _stage(
        self, tier: TierConfig, rows: list[Row], runs: list[Run], holders: dict[str, str]
    ) -> PeerStage:
        """The copies of one peer tier to make again: each run's batches on the new holder of
        its node, reading the run's source (the stage's own, the shards' node's local copy over
        its endpoint, is left implicit, as the lifecycle's batches leave it)."""
        source = self._source_of(tier)
        batches = [
            b
            if (src, at) == (source.name, b.node)
            else b.model_copy(update={"source_tier": src, "source_node": at})
            for (src, at), run in runs
            for b in self._batches(run, tier)
        ]
        return PeerStage(
            tier=_plan_tier(tier),
            source=_plan_tier(source),
            batches=[
                b.model_copy(update={"holder": holders[b.node]})
                for b in batches
                if b.node in holders
            ],
            unreachable=len(rows) - sum(len(run) for _, run in runs),
            unplaced=sorted({b.node for b in batches if b.node not in holders}),
        )

    def _batches(self, rows: list[Row], tier: TierConfig) -> list[Batch]:
        return plan_batches(
            rows,
            batch_size(self._settings, len(rows)),
            tier.parallelism,
            self._settings.min_batch_bytes,
        )


Row = tuple[str, int, int]
# A copy to read: its tier, and the node whose data endpoint serves it (the shards' node for its
# local copy, the holder for a peer copy); None off the nodes (a shared tier, S3).
Source = tuple[str, str | None]
Run = tuple[Source, list[Row]]


def _runs(
    rows: list[Row], order: list[str], verified: dict[tuple[str, int], dict[str, str | None]]
) -> list[Run]:
    """Each shard read from the first tier of `order` that holds it verified (`verified`:
    (node, ordinal) -> tier -> where), as runs of consecutive shards of one node with the same
    source, so that no two batches' ordinal ranges overlap; a shard that no tier holds verified
    is in no run."""
    runs: list[Run] = []
    last: tuple[str, Source] | None = None
    for row in rows:
        held = verified.get((row[0], row[1]), {})
        tier = next((t for t in order if t in held), None)
        if tier is None:
            last = None
            continue
        src = (tier, held[tier])
        if last != (row[0], src):
            runs.append((src, []))
            last = (row[0], src)
        runs[-1][1].append(row)
    return runs
