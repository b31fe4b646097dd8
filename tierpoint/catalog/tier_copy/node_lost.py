"""A node declared lost: an operator's statement that a node's local tier is gone for good
(hardware failed, the machine left the cluster). In one transaction its replicas become `lost`,
the local tier copies of checkpoints with shards there and the peer tier copies it held fail,
and the events say so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import lost_reason
from tierpoint.catalog.replica.placement import held_peer_checkpoints
from tierpoint.errors import NodeNotFound
from tierpoint.states import ReplicaState, TierState


@dataclass(frozen=True)
class AffectedCheckpoint:
    checkpoint_id: int
    job: str
    step: int
    # Some marker is still pending: its lifecycle may be waiting on the node.
    in_flight: bool


@dataclass
class NodeLost:
    node: str
    lost_at: datetime
    changed: bool  # this call declared it (False: it was lost already)
    replicas_lost: int
    markers_failed: int
    checkpoints: list[AffectedCheckpoint] = field(default_factory=list)
    # (id, job, step) of checkpoints whose peer copy the node held: to be copied again elsewhere
    peer_copies_lost: list[tuple[int, str, int]] = field(default_factory=list)


# Copies being expired are retention's to finish; lost ones are lost already.
_KEPT = [ReplicaState.LOST.value, ReplicaState.EXPIRING.value, ReplicaState.EXPIRED.value]


def mark_lost(
    session: Session,
    node: str,
    local_tiers: Sequence[str],
    actor: str,
    peer_tiers: Sequence[str] = (),
) -> NodeLost:
    """Declare `node` lost in the caller's transaction. Its replicas become `lost`; every
    checkpoint with shards on it has its `local_tiers` markers, if pending or restorable, turned
    `failed` with the reason, and so has every `peer_tiers` marker of a checkpoint whose copy
    there the node held (for re-replication to make again). Only the copies that lost bytes
    fail: the copies other nodes hold of the lost node's shards stay, and so do the local copies
    of checkpoints of which the node held only peer copies. One `node_lost` event per affected
    checkpoint and one for the node.
    Idempotent: again changes nothing and reports the checkpoints still in flight, so that their
    lifecycles can be told again. Raises NodeNotFound for a node that never reported in."""
    lost_at, changed = _set_lost_at(session, node)
    reason = lost_reason(node)
    lost_rows = _lose_replicas(session, node, reason)
    lost_per_checkpoint: dict[int, int] = {}
    for cp, _ in lost_rows:
        lost_per_checkpoint[cp] = lost_per_checkpoint.get(cp, 0) + 1
    replicas_lost = len(lost_rows)
    pending = _pending_with_shards_on(session, node)
    ids = sorted(set(lost_per_checkpoint) | set(pending))
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
    failed_tiers = _fail_local_markers(session, own, local_tiers, reason)
    # guard: lost-holder-fails-peer-marker
    held = _fail_held_peer_markers(session, node, peer_tiers, reason)
    for cp, tiers in held.items():
        failed_tiers.setdefault(cp, []).extend(tiers)
    markers_failed = sum(len(t) for t in failed_tiers.values())
    out = NodeLost(node, lost_at, changed, replicas_lost, markers_failed)
    # Asked again on every declaration, so that repeating it re-starts what Temporal missed.
    out.peer_copies_lost = held_peer_checkpoints(session, node, peer_tiers)
    for cp, job_id, job, step, in_flight in _affected(session, ids):
        out.checkpoints.append(AffectedCheckpoint(cp, job, step, bool(in_flight)))
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
    if changed:
        record(
            session,
            EventKind.NODE_LOST,
            actor=actor,
            detail={"node": node, "checkpoints": len(ids), "replicas_lost": replicas_lost},
        )
    return out


def _set_lost_at(session: Session, node: str) -> tuple[datetime, bool]:
    """(when the node was declared lost, whether it is this call that declared it)."""
    row = (
        session.execute(select(Node.lost_at).where(Node.id == node).with_for_update(of=Node))
    ).one_or_none()
    if row is None:
        raise NodeNotFound(f"node {node!r} is unknown: a node is known once its worker reported in")
    changed = row.lost_at is None
    if changed:
        session.execute(update(Node).where(Node.id == node).values(lost_at=func.now()))
    lost_at = session.scalar(select(Node.lost_at).where(Node.id == node))
    assert lost_at is not None
    return lost_at, changed


def _lose_replicas(session: Session, node: str, reason: str) -> list[tuple[int, str]]:
    """(checkpoint, tier) of each replica turned `lost`: the node's own local copies and the
    peer copies it held for other nodes."""
    rows = session.execute(
        update(Replica)
        .where(
            Replica.node_id == node,
            Replica.state.notin_(_KEPT),
        )
        .values(state=ReplicaState.LOST.value, error=reason, updated_at=func.now())
        .returning(Replica.checkpoint_id, Replica.tier)
    ).all()
    return [(cp, tier) for cp, tier in rows]


def _pending_with_shards_on(session: Session, node: str) -> Sequence[int]:
    # Checkpoints whose lifecycle has not sealed the node's shards yet hold no replica there:
    # found through their pending markers (few: the checkpoints in flight).
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


def _fail_local_markers(
    session: Session, ids: Sequence[int], local_tiers: Sequence[str], reason: str
) -> dict[int, list[str]]:
    """The local tiers' pending or restorable markers of `ids` turned `failed`, per checkpoint."""
    failed = (
        session.execute(
            update(TierCopy)
            .where(
                TierCopy.checkpoint_id.in_(ids),
                TierCopy.tier.in_(list(local_tiers)),
                TierCopy.state.in_([TierState.PENDING.value, TierState.RESTORABLE.value]),
            )
            .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
            .returning(TierCopy.checkpoint_id, TierCopy.tier)
        )
    ).all()
    failed_tiers: dict[int, list[str]] = {}
    for cp, tier in failed:
        failed_tiers.setdefault(cp, []).append(tier)
    return failed_tiers


def _fail_held_peer_markers(
    session: Session, node: str, peer_tiers: Sequence[str], reason: str
) -> dict[int, list[str]]:
    """The peer tiers' pending or restorable markers of checkpoints with a copy on `node`
    (lost now) turned `failed`, per checkpoint: without that copy the tier lacks a shard."""
    if not peer_tiers:
        return {}
    held = exists().where(
        Replica.checkpoint_id == TierCopy.checkpoint_id,
        Replica.tier == TierCopy.tier,
        Replica.node_id == node,
        Replica.state == ReplicaState.LOST.value,
    )
    failed = (
        session.execute(
            update(TierCopy)
            .where(
                TierCopy.tier.in_(list(peer_tiers)),
                TierCopy.state.in_([TierState.PENDING.value, TierState.RESTORABLE.value]),
                held,
            )
            .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
            .returning(TierCopy.checkpoint_id, TierCopy.tier)
        )
    ).all()
    out: dict[int, list[str]] = {}
    for cp, tier in failed:
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
            select(Checkpoint.id, Checkpoint.job_id, Job.name, Checkpoint.step, still_pending)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.id.in_(ids))
            .order_by(Checkpoint.id)
        )
    ).all()
