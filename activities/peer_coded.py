"""The plan of a coded peer tier's rebuild after a node was lost, the coded half of
`peer.plan`: in a restorable coded copy every stripe lost with its holder (or found corrupt) is
given a new holder, which holds no stripe of its set (placement's rule, `placement.rehome`), and
moved there in the catalog (`re-placed`); the batches then cut each one again on its new holder
(`stripes.rebuild_batch`, activities/rebuild.py), reading the copy's other stripes, which the plan
holds against retention until the stage's promotion (`holds/rebuild.py`).

A copy that is not restorable is not rebuilt: some set kept fewer than k verified stripes, so
nothing can cut its stripes again, and the next tier serves the checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from tierpoint_client.erasure import Code

from tierpoint.catalog.engine import Session
from tierpoint.catalog.holds.rebuild import hold_own_stripes
from tierpoint.catalog.node import registry
from tierpoint.catalog.stripe import machine, rebuilding
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, PlanTier
from tierpoint.contract.peer import PeerStage
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierConfig

from .batching import batch_size, plan_batches
from .placement import rehome

# A set's stripe that its rebuild cuts again: moved to a live holder and not verified there yet.
_TO_CUT = {ReplicaState.PENDING.value, ReplicaState.COPYING.value, ReplicaState.CORRUPT.value}
_GONE = {ReplicaState.LOST.value, ReplicaState.CORRUPT.value}


def coded_stage(
    session: Session,
    settings: Settings,
    checkpoint_id: int,
    tier: TierConfig,
    source: PlanTier,
    code: Code,
) -> PeerStage | None:
    """The rebuild of the checkpoint's copy on the coded `tier`, its lost stripes re-placed in
    the caller's transaction; None when there is nothing to rebuild (every set whole) or nothing
    to rebuild from (the copy is not restorable)."""
    if rebuilding.copy_state(session, checkpoint_id, tier.name) != TierState.RESTORABLE.value:
        return None
    sets = rebuilding.stripe_sets(session, checkpoint_id, tier.name)
    named = {m.node for s in sets for m in s.members}
    lost = set(registry.lost_among(session, named))
    serving = registry.serving_nodes(session)
    domains = registry.failure_domains(session, [*serving, *{s.node for s in sets}])
    moves: list[machine.NewHolder] = []
    unplaced: set[str] = set()
    below_k = 0
    for st in sets:
        not_lost = [m for m in st.members if m.node not in lost]
        if sum(m.state == ReplicaState.VERIFIED.value for m in not_lost) < code.k:
            below_k += 1
            continue
        held = {m.node for m in not_lost}
        for m in st.members:
            if m.state not in _GONE:
                continue
            new = rehome(st.node, serving, held, domains)
            if new is None:
                unplaced.add(st.node)
                continue
            held.add(new)
            moves.append(machine.NewHolder(st.shard_id, m.index, new))
    machine.re_place(session, tier.name, moves)
    # The stripes to cut now, the ones just re-placed and any an earlier run left unverified.
    after = rebuilding.stripe_sets(session, checkpoint_id, tier.name)
    work: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for st in after:
        for m in st.members:
            if m.state in _TO_CUT and m.node not in lost and m.node in serving:
                work.setdefault((st.node, m.node), []).append((st.node, st.ordinal, st.size))
    if not work and not unplaced and not below_k:
        return None
    if work:
        # Its stripes are what the batches read: retention keeps the copy until the stage's
        # promotion releases it (under the checkpoint's row lock, which the caller holds).
        hold_own_stripes(session, checkpoint_id, tier.name, datetime.now(UTC))
    return PeerStage(
        tier=PlanTier(name=tier.name, kind=tier.kind, parallelism=tier.parallelism, code=str(code)),
        source=source,
        batches=_batches(settings, tier, work),
        unreachable=below_k,
        unplaced=sorted(unplaced),
    )


def _batches(
    settings: Settings, tier: TierConfig, work: dict[tuple[str, str], list[tuple[str, int, int]]]
) -> list[Batch]:
    """Per (shards' node, new holder), batches of the shards whose stripe the holder cuts; the
    batch reads the coded tier itself (`source_tier`), from no one node: any k holders do."""
    out: list[Batch] = []
    for (_, holder), rows in sorted(work.items()):
        size = batch_size(settings, len(rows))
        for b in plan_batches(rows, size, tier.parallelism, settings.min_batch_bytes):
            out.append(b.model_copy(update={"holder": holder, "source_tier": tier.name}))
    return out


__all__: Sequence[str] = ["coded_stage"]
