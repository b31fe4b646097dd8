"""A node declared lost: an operator's statement that a node's local tier is gone for good
(hardware failed, the machine left the cluster). In one transaction its replicas become `lost`,
the local tier copies of checkpoints with shards there and the peer tier copies it held fail,
and the events say so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.locks import Locked, RowLock, lock_in_order
from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard, Stripe, TierCopy
from tierpoint.catalog.node.registry import lost_reason
from tierpoint.catalog.replica.machine import Move as ReplicaMove
from tierpoint.catalog.replica.machine import lose_on_node
from tierpoint.catalog.replica.machine import sources as replica_sources
from tierpoint.catalog.replica.placement import held_peer_checkpoints, placing_peer_copies
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.errors import NodeNotFound
from tierpoint.states import ReplicaState, TierState


@dataclass(frozen=True)
class AffectedCheckpoint:
    checkpoint_id: int
    job: str
    step: int
    # Some tier copy is still pending: its lifecycle may be waiting on the node.
    in_flight: bool
    branch: int = 1  # names its lifecycle (`contract.lifecycle.workflow_id`)


@dataclass
class NodeLost:
    node: str
    lost_at: datetime
    changed: bool  # this call declared it (False: it was lost already)
    replicas_lost: int
    tier_copies_failed: int
    checkpoints: list[AffectedCheckpoint] = field(default_factory=list)
    # (id, job, step) of checkpoints whose peer copy the node held: to be copied again elsewhere
    peer_copies_lost: list[tuple[int, str, int, int]] = field(default_factory=list)


def mark_lost(
    session: Session,
    node: str,
    local_tiers: Sequence[str],
    actor: str,
    peer_tiers: Sequence[str] = (),
    codes: Mapping[str, Code] | None = None,
) -> NodeLost:
    """Declare `node` lost in the caller's transaction. Its replicas become `lost`; every
    checkpoint with shards on it has its `local_tiers` tier copies, if pending or restorable,
    turned `failed` with the reason, and so has every `peer_tiers` tier copy of a checkpoint
    whose copy there the node held (for re-replication to make again). Only the copies that
    lost bytes fail: the copies other nodes hold of the lost node's shards stay, and so do the
    local copies of checkpoints of which the node held only peer copies. A coded peer tier
    (`codes`: tier -> its code) loses the stripes the node held; its restorable copies fail
    only once a shard keeps fewer than k verified stripes (any k give the file back), and a
    pending one is left to its promotion, which needs every set whole. One `node_lost` event
    per affected checkpoint and one for the node.
    Idempotent: again changes nothing and reports the checkpoints still in flight, so that their
    lifecycles can be told again. Raises NodeNotFound for a node that never reported in."""
    locked, lost_at, changed = _set_lost_at(session, node)
    reason = lost_reason(node)
    # The node's row is held: no seal or copy writes replicas there until this commits. The tier
    # copies that may fail are locked before the replicas move, in the catalog's order.
    coded = dict(codes or {})
    _lock_tier_copies_at_stake(session, locked, node, local_tiers, peer_tiers, coded)
    lost_rows = lose_on_node(session, locked, node, reason)
    # The stripes it held of coded peer tiers go with it: a set stays decodable while k remain.
    # guard: node-lost-loses-its-stripes
    stripes.lose_on_node(session, node, reason)
    lost_per_checkpoint: dict[int, int] = {}
    for cp, _ in lost_rows:
        lost_per_checkpoint[cp] = lost_per_checkpoint.get(cp, 0) + 1
    replicas_lost = len(lost_rows)
    pending = _pending_with_shards_on(session, node)
    # Checkpoints still placing peer copies: their lifecycle may have planned one on the node,
    # and nothing of it is in the catalog yet. Told like the others (so that none waits on the
    # node's queue), and re-replicated once their lifecycle has placed the rest.
    # guard: node-lost-tells-lifecycles-placing-peer-copies
    placing = placing_peer_copies(session, peer_tiers)
    ids = sorted(
        set(lost_per_checkpoint)
        | set(pending)
        | {cp for cp, *_ in placing}
        | {cp for cp, _ in _coded_on(session, node, coded)}
    )
    if not ids:
        if changed:
            record(
                session, EventKind.NODE_LOST, actor=actor, detail={"node": node, "checkpoints": 0}
            )
        return NodeLost(node, lost_at, changed, 0, 0)

    # A local copy lost bytes only if the node wrote shards of it. A checkpoint of which the node
    # held only peer copies keeps its local copies on their own nodes, intact and restorable.
    own = sorted({cp for cp, tier in lost_rows if tier in local_tiers} | set(pending))
    # guard: node-lost-fails-only-the-lost-nodes-copies
    failed_tiers = _fail(session, locked, Move.NODE_LOST, own, local_tiers, reason)
    # guard: lost-holder-fails-peer-tier-copy
    held = _fail_held_peer_copies(session, locked, node, peer_tiers, reason)
    for cp, tiers in _fail_undecodable(session, locked, node, coded, reason).items():
        held.setdefault(cp, []).extend(tiers)
    for cp, tiers in held.items():
        failed_tiers.setdefault(cp, []).extend(tiers)
    tier_copies_failed = sum(len(t) for t in failed_tiers.values())
    out = NodeLost(node, lost_at, changed, replicas_lost, tier_copies_failed)
    # Re-replicated besides the peer copies it held: its restorable coded copies' stripes.
    # guard: node-lost-rebuilds-coded-copies
    remade = [*placing, *_coded_to_rebuild(session, node, coded)]
    _record(session, out, actor, peer_tiers, remade, ids, lost_per_checkpoint, failed_tiers)
    return out


def _record(
    session: Session,
    out: NodeLost,
    actor: str,
    peer_tiers: Sequence[str],
    remade: Sequence[tuple[int, str, int, int]],
    ids: Sequence[int],
    lost_per_checkpoint: dict[int, int],
    failed_tiers: dict[int, list[str]],
) -> None:
    """The affected checkpoints into `out`, and the declaration's events."""
    node = out.node
    # Asked again on every declaration, so that repeating it re-starts what Temporal missed.
    out.peer_copies_lost = sorted(
        set(held_peer_checkpoints(session, node, peer_tiers)) | set(remade)
    )
    for cp, job_id, job, step, in_flight, branch in _affected(session, ids):
        out.checkpoints.append(AffectedCheckpoint(cp, job, step, bool(in_flight), branch))
        if lost_per_checkpoint.get(cp) or failed_tiers.get(cp):
            record(
                session,
                EventKind.NODE_LOST,
                checkpoint_id=cp,
                job_id=job_id,
                actor=actor,
                detail={
                    "node": node,
                    "replicas_lost": lost_per_checkpoint.get(cp, 0),
                    "tiers_failed": sorted(failed_tiers.get(cp, [])),
                },
            )
    if out.changed:
        record(
            session,
            EventKind.NODE_LOST,
            actor=actor,
            detail={"node": node, "checkpoints": len(ids), "replicas_lost": out.replicas_lost},
        )


def _set_lost_at(session: Session, node: str) -> tuple[Locked, datetime, bool]:
    """The node's row locked for update, when it was declared lost, and whether it is this call
    that declared it."""
    locked = lock_in_order(session, nodes=[node], node_lock=RowLock.UPDATE)
    if node not in locked.nodes:
        raise NodeNotFound(f"node {node!r} is unknown: a node is known once its worker reported in")
    changed = locked.nodes[node] is None
    if changed:
        session.execute(update(Node).where(Node.id == node).values(lost_at=func.now()))
    lost_at = session.scalar(select(Node.lost_at).where(Node.id == node))
    assert lost_at is not None
    return locked, lost_at, changed


def _lock_tier_copies_at_stake(
    session: Session,
    locked: Locked,
    node: str,
    local_tiers: Sequence[str],
    peer_tiers: Sequence[str],
    coded: Mapping[str, Code],
) -> None:
    """Lock (into `locked`) every tier copy the declaration may fail: the local tier copies of
    checkpoints with a replica on the node or still pending with shards there, the peer tier
    copies whose copy the node holds, and the coded copies it holds stripes of."""
    on_node = session.execute(
        select(Replica.checkpoint_id, Replica.tier)
        .where(
            Replica.node_id == node,
            Replica.state.in_([*replica_sources(ReplicaMove.NODE_LOST), ReplicaState.LOST.value]),
        )
        .distinct()
    ).all()
    own = {cp for cp, _ in on_node} | set(_pending_with_shards_on(session, node))
    pairs = {(cp, t) for cp in own for t in local_tiers}
    pairs |= {(cp, tier) for cp, tier in on_node if tier in peer_tiers}
    pairs |= set(_coded_on(session, node, coded))
    # The checkpoints' rows first, FOR KEY SHARE: the declaration's events take that lock (their
    # foreign key) after it holds the tier copies, and retention holds a row FOR UPDATE while it
    # waits for the row's tier copies; taken after them, the two waited for each other.
    # guard: node-lost-locks-checkpoints-first
    lock_in_order(
        session,
        checkpoints=sorted({cp for cp, _ in pairs}),
        checkpoint_lock=RowLock.KEY_SHARE,
        tier_copies=pairs,
        into=locked,
    )


def _coded_on(session: Session, node: str, coded: Mapping[str, Code]) -> list[tuple[int, str]]:
    """(checkpoint id, coded tier) of every coded copy the node holds (or held) stripes of."""
    if not coded:
        return []
    rows = session.execute(
        select(Stripe.checkpoint_id, Stripe.tier)
        .where(
            Stripe.node_id == node,
            Stripe.tier.in_(sorted(coded)),
            Stripe.state.in_([*stripes.NODE_LOST_SOURCES, ReplicaState.LOST.value]),
        )
        .distinct()
    )
    return sorted((cp, tier) for cp, tier in rows)


def _coded_to_rebuild(
    session: Session, node: str, coded: Mapping[str, Code]
) -> list[tuple[int, str, int, int]]:
    """(id, job, step, branch) of the checkpoints whose coded copy (restorable or failed) the
    node held stripes of: a re-replication rebuilds a restorable one on live nodes, and a run
    under way is told of the loss, whatever its copy's state now, so that none waits on the
    node's queue. A failed copy (a set below k) is not rebuilt (the plan leaves it: nothing can
    cut its stripes again), and the next tier serves it."""
    ids = sorted({cp for cp, tier in _coded_on(session, node, coded)})
    if not ids:
        return []
    rows = session.execute(
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .join(TierCopy, TierCopy.checkpoint_id == Checkpoint.id)
        .where(
            Checkpoint.id.in_(ids),
            TierCopy.tier.in_(sorted(coded)),
            TierCopy.state.in_([TierState.RESTORABLE.value, TierState.FAILED.value]),
        )
        .distinct()
    )
    return [(r.id, r.name, r.step, r.branch) for r in rows]


def _fail_undecodable(
    session: Session, locked: Locked, node: str, coded: Mapping[str, Code], reason: str
) -> dict[int, list[str]]:
    """The restorable coded copies the node held stripes of in which some shard now keeps
    fewer than k verified stripes, turned `failed`, per checkpoint: no restore can decode it."""
    gone = []
    for cp, tier in _coded_on(session, node, coded):
        copy = locked.tier_copies.get((cp, tier))
        if copy is None or copy.state != TierState.RESTORABLE.value:
            continue
        # guard: coded-copy-fails-only-below-k
        if not coverage(coded[tier], verified_stripes(session, cp, tier)).restorable:
            gone.append((cp, tier))
    failed = move(session, locked, Move.HOLDER_LOST, gone, reason=reason)
    out: dict[int, list[str]] = {}
    for cp, tier in sorted(failed):
        out.setdefault(cp, []).append(tier)
    return out


def _pending_with_shards_on(session: Session, node: str) -> Sequence[int]:
    # Checkpoints whose lifecycle has not sealed the node's shards yet hold no replica there:
    # found through their pending tier copies (few: the checkpoints in flight).
    has_shard_there = exists().where(
        Shard.checkpoint_id == TierCopy.checkpoint_id, Shard.node_id == node
    )
    return (
        session.scalars(
            select(TierCopy.checkpoint_id)
            .where(TierCopy.state == TierState.PENDING.value, has_shard_there)
            .distinct()
        )
    ).all()


def _fail(
    session: Session,
    locked: Locked,
    how: Move,
    ids: Sequence[int],
    tiers: Sequence[str],
    reason: str,
) -> dict[int, list[str]]:
    """The `tiers`' pending or restorable tier copies of `ids` turned `failed`, per checkpoint."""
    failed = move(session, locked, how, [(cp, t) for cp in ids for t in tiers], reason=reason)
    out: dict[int, list[str]] = {}
    for cp, tier in sorted(failed):
        out.setdefault(cp, []).append(tier)
    return out


def _fail_held_peer_copies(
    session: Session, locked: Locked, node: str, peer_tiers: Sequence[str], reason: str
) -> dict[int, list[str]]:
    """The peer tiers' pending or restorable tier copies of checkpoints with a copy on `node`
    (lost now) turned `failed`, per checkpoint: without that copy the tier lacks a shard."""
    if not peer_tiers:
        return {}
    held = session.execute(
        select(Replica.checkpoint_id, Replica.tier)
        .where(
            Replica.node_id == node,
            Replica.tier.in_(list(peer_tiers)),
            Replica.state == ReplicaState.LOST.value,
        )
        .distinct()
    ).all()
    failed = move(session, locked, Move.HOLDER_LOST, [(c, t) for c, t in held], reason=reason)
    out: dict[int, list[str]] = {}
    for cp, tier in sorted(failed):
        out.setdefault(cp, []).append(tier)
    return out


def _affected(session: Session, ids: Sequence[int]) -> Sequence[Any]:
    """(id, job id, job name, step, still in flight) of each checkpoint of `ids`, by id."""
    still_pending = exists().where(
        TierCopy.checkpoint_id == Checkpoint.id,
        TierCopy.state == TierState.PENDING.value,
    )
    return (
        session.execute(
            select(
                Checkpoint.id,
                Checkpoint.job_id,
                Job.name,
                Checkpoint.step,
                still_pending,
                Checkpoint.branch,
            )
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.id.in_(ids))
            .order_by(Checkpoint.id)
        )
    ).all()
