"""Catalog side of repair: which tiers of a checkpoint have shards without a verified replica that
repair may re-copy, where each shard's copy comes from, and the batches of a repair round.

Repair touches only tier copies that are `failed` (demoted for damage, or a copy that failed) or
`restorable`; never `pending` (the lifecycle is still at work there) nor `expiring`/`expired`
(retention let the copy go: repair must not resurrect it). It re-copies a tier only if retention
would keep a good copy there (the pure planner, asked about the checkpoint as if the copy were
good), and only shards that another tier holds verified. A coded copy is not re-copied: its
stripes found bad are its rebuild's (`activities/peer_coded.py`), which repair asks for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.holds.rebuild import hold_sources
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.locks import RowLock, lock_checkpoint
from tierpoint.catalog.models import VERIFIED, Checkpoint, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import lost_nodes
from tierpoint.catalog.policy.assigned import policy_for_job
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.catalog.replica.placement import not_on_lost_node
from tierpoint.catalog.stripe import rebuilding
from tierpoint.contract.integrity import RepairBatch, RepairPlan, RepairTier
from tierpoint.contract.lifecycle import Batch
from tierpoint.retention import models as planned
from tierpoint.retention.planner import plan as retention_plan
from tierpoint.retention.policy import TierRef
from tierpoint.states import TierState
from tierpoint.tier_config import TierConfig, TierKind

# guard: repair-touches-expiring-copies
REPAIRABLE = (TierState.FAILED.value, TierState.RESTORABLE.value)


@dataclass(frozen=True)
class ShardSources:
    shard_id: int
    ordinal: int
    node: str
    # verified replicas: tier -> node (a local copy's, a peer copy's holder) or None
    verified: dict[str, str | None]


def shard_sources(session: Session, checkpoint_id: int) -> list[ShardSources]:
    """Every shard of the checkpoint with the tiers that hold it verified on a node not lost (or off
    the nodes), in ordinal order."""
    shards = session.execute(
        select(Shard.id, Shard.ordinal, Shard.node_id)
        .where(Shard.checkpoint_id == checkpoint_id)
        .order_by(Shard.ordinal)
    ).all()
    verified: dict[int, dict[str, str | None]] = defaultdict(dict)
    for sid, tier, node in session.execute(
        select(Replica.shard_id, Replica.tier, Replica.node_id).where(
            Replica.checkpoint_id == checkpoint_id, Replica.state == VERIFIED, not_on_lost_node()
        )
    ):
        verified[sid][tier] = node
    return [ShardSources(s.id, s.ordinal, s.node_id, verified.get(s.id, {})) for s in shards]


def prefers_node(shard: ShardSources, tiers: Sequence[TierConfig], lost: set[str]) -> bool:
    """The shard's fastest verified copy is on its node's local tier, and the node is not lost:
    its copy is made by that node's worker (the only one that can read it)."""
    for t in tiers:
        if t.name not in shard.verified or t.kind is TierKind.PEER:
            continue
        return t.kind is TierKind.LOCAL and shard.node not in lost
    return False


def reads_peer_copies(dst: TierConfig) -> bool:
    """A repair of a copy on `dst` runs on a node worker, which reads another node's copies (a
    peer copy on its holder) over that node's data endpoint: a local or peer destination. The
    shared worker repairing a shared tier or S3 reads only what it reaches itself."""
    return dst.on_nodes


def source_of(
    shard: ShardSources, dst: TierConfig, tiers: Sequence[TierConfig], lost: set[str]
) -> str | None:
    """The tier a repair of the shard on `dst` reads from: the fastest that holds it verified and
    that the worker doing the repair can read (as `activities/repair.py` picks it), or None."""
    for t in tiers:
        if t.name == dst.name or t.name not in shard.verified:
            continue
        if t.kind is TierKind.PEER and not reads_peer_copies(dst):
            continue
        if t.kind is TierKind.LOCAL and shard.node in lost:
            continue
        return t.name
    return None


def has_source(
    shard: ShardSources, dst: TierConfig, tiers: Sequence[TierConfig], lost: set[str]
) -> bool:
    return source_of(shard, dst, tiers, lost) is not None


def retention_keeps(
    session: Session,
    job: str,
    checkpoint_id: int,
    tier: str,
    tiers: Sequence[TierConfig],
    now: datetime,
) -> bool:
    """Would retention keep a good copy of the checkpoint on `tier` now? Asked of the planner
    with the copy made good in the snapshot: a copy it would expire at once is not worth making.
    A policy that does not validate answers yes (an extra copy is safe, a missing one is not)."""
    refs = [TierRef(t.name, t.kind) for t in tiers]
    try:
        policy = policy_for_job(session, job).policy
    except ValidationError:
        return True
    snap = take_snapshot(session, job, refs, now)
    checkpoints = []
    for c in snap.checkpoints:
        if c.id == checkpoint_id:
            copies = dict(c.copies)
            copies[tier] = planned.TierCopy(
                state=TierState.RESTORABLE, verified=True, bytes=c.total_bytes, quarantined=False
            )
            c = c.model_copy(update={"copies": copies})
        checkpoints.append(c)
    result = retention_plan(
        snap.model_copy(update={"checkpoints": tuple(checkpoints)}), policy, now
    )
    return not any(e.checkpoint_id == checkpoint_id and e.tier == tier for e in result.expiries)


def _ranges(node: str, ordinals: list[int], size: int) -> list[Batch]:
    return [
        Batch(node=node, first=ordinals[i : i + size][0], last=ordinals[i : i + size][-1])
        for i in range(0, len(ordinals), size)
    ]


def plan_repair(
    session: Session,
    checkpoint_id: int,
    tiers: Sequence[TierConfig],
    now: datetime,
    batch_size: int,
    limit: int,
) -> RepairPlan:
    head = checkpoint_head(session, checkpoint_id)
    if head is None:
        return RepairPlan(checkpoint_id=checkpoint_id, job="", step=0, left=["checkpoint is gone"])
    # Under the checkpoint's row lock, as retention's re-check: the copies a tier's repair reads
    # are held (holds/rebuild.py) before any expiry of them can begin.
    lock_checkpoint(session, checkpoint_id, RowLock.NO_KEY_UPDATE)
    out = RepairPlan(checkpoint_id=head.id, job=head.job, step=head.step)
    quarantined = session.scalar(
        select(Checkpoint.quarantine_reason).where(Checkpoint.id == checkpoint_id)
    )
    if quarantined is not None:
        out.left.append(f"checkpoint quarantined: {quarantined}")
        return out
    tier_copies = {
        m.tier: m
        for m in session.execute(
            select(TierCopy.tier, TierCopy.state, TierCopy.quarantine_reason).where(
                TierCopy.checkpoint_id == checkpoint_id
            )
        )
    }
    shards = shard_sources(session, checkpoint_id)
    lost = lost_nodes(session, sorted({s.node for s in shards}))
    budget = limit
    for dst in tiers:
        m = tier_copies.get(dst.name)
        if dst.stripe_code is not None:
            # A coded copy holds stripes, never replicas: its stripes found bad are cut again by
            # its rebuild (activities/peer_coded.py), which the repair's activity asks for.
            if m is not None and rebuilding.due(session, dst.name, [checkpoint_id]):
                out.left.append(f"{dst.name}: its stripes found bad are cut again by its rebuild")
            continue
        bad = [s for s in shards if dst.name not in s.verified]
        if m is None or not bad:
            continue
        if m.state not in REPAIRABLE:
            if m.state == TierState.PENDING.value:
                out.left.append(f"{dst.name}: still being copied by the lifecycle")
            continue
        if m.quarantine_reason is not None:
            out.left.append(f"{dst.name}: quarantined: {m.quarantine_reason}")
            continue
        if not retention_keeps(session, head.job, head.id, dst.name, tiers, now):
            out.left.append(f"{dst.name}: retention would not keep a copy here")
            continue
        if dst.kind is TierKind.PEER:
            batches = _peer_batches(session, out, dst, bad, tiers, batch_size)
        else:
            batches = _batches(out, dst, bad, tiers, lost, batch_size)
        if len(batches) > budget:
            batches, out.more = batches[:budget], True
        budget -= len(batches)
        if batches:
            out.tiers.append(
                RepairTier(tier=dst.name, parallelism=dst.parallelism, batches=batches)
            )
            # What each shard is read from (as the copy picks it), held against retention.
            reads = [r for s in bad if (r := source_of(s, dst, tiers, lost)) is not None]
            # guard: repair-holds-its-sources
            hold_sources(session, checkpoint_id, dst.name, reads, now)
        if budget <= 0:
            out.more = True
            break
    return out


def _batches(
    out: RepairPlan,
    dst: TierConfig,
    bad: list[ShardSources],
    tiers: Sequence[TierConfig],
    lost: set[str],
    batch_size: int,
) -> list[RepairBatch]:
    """A local or shared tier's batches: on the shards' node's queue when that node copies them
    (its own tier, or its local copy is the fastest source), else on the shared queue."""
    if dst.kind is TierKind.LOCAL:
        unreachable = [s for s in bad if s.node in lost]
        if unreachable:
            out.left.append(f"{dst.name}: {len(unreachable)} shard(s) on lost nodes")
        bad = [s for s in bad if s.node not in lost]
    groups: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for s in _sourced(out, dst, bad, tiers, lost):
        on_node = dst.kind is TierKind.LOCAL or prefers_node(s, tiers, lost)
        groups[(s.node, on_node)].append(s.ordinal)
    return [
        RepairBatch(batch=b, on_node=on_node)
        for (node, on_node), ordinals in sorted(groups.items())
        for b in _ranges(node, ordinals, batch_size)
    ]


def _sourced(
    out: RepairPlan,
    dst: TierConfig,
    bad: list[ShardSources],
    tiers: Sequence[TierConfig],
    lost: set[str],
) -> list[ShardSources]:
    sourced = [s for s in bad if has_source(s, dst, tiers, lost)]
    if len(sourced) < len(bad):
        out.left.append(f"{dst.name}: no verified source of {len(bad) - len(sourced)} shard(s)")
    return sourced


def _peer_batches(
    session: Session,
    out: RepairPlan,
    dst: TierConfig,
    bad: list[ShardSources],
    tiers: Sequence[TierConfig],
    batch_size: int,
) -> list[RepairBatch]:
    """A peer tier's batches: each shard is copied again onto the node its replica names (its
    holder), on that holder's queue. A shard whose holder is lost, or that never had one, is
    placement's: re-replication puts it on the ring of the serving nodes, repair does not."""
    held = peer_holders(session, out.checkpoint_id, dst.name)
    lost = lost_nodes(session, sorted({s.node for s in bad} | {h for h in held.values() if h}))
    homed = [s for s in bad if held.get(s.shard_id) not in (None, s.node, *lost)]
    if len(homed) < len(bad):
        out.left.append(
            f"{dst.name}: {len(bad) - len(homed)} shard(s) with no holder that is not lost "
            "(re-replication places them)"
        )
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for s in _sourced(out, dst, homed, tiers, lost):
        groups[(s.node, held[s.shard_id] or "")].append(s.ordinal)
    return [
        RepairBatch(batch=b.model_copy(update={"holder": holder}), on_node=True)
        for (node, holder), ordinals in sorted(groups.items())
        for b in _ranges(node, ordinals, batch_size)
    ]


def peer_holders(session: Session, checkpoint_id: int, tier: str) -> dict[int, str | None]:
    """shard id -> the node its replica on peer tier `tier` names (its holder), in any state."""
    rows = session.execute(
        select(Replica.shard_id, Replica.node_id).where(
            Replica.checkpoint_id == checkpoint_id, Replica.tier == tier
        )
    )
    return {sid: node for sid, node in rows}


def tiers_to_rereplicate(
    session: Session, checkpoint_id: int, peer_tiers: Sequence[str]
) -> list[str]:
    """The peer tiers whose copy of the checkpoint failed (a holder was lost, a copy failed)."""
    return list(
        session.scalars(
            select(TierCopy.tier).where(
                TierCopy.checkpoint_id == checkpoint_id,
                TierCopy.tier.in_(list(peer_tiers)),
                TierCopy.state == TierState.FAILED.value,
                TierCopy.quarantine_reason.is_(None),
            )
        )
    )
