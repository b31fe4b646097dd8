"""Nodes report in through their workers; the API accepts shards only on known nodes that are not
lost. An operator declares a node lost when its local tier is gone for good (hardware failed, the
machine left the cluster): its local replicas become `lost` and the local markers of checkpoints
with shards there stop being restorable, in one transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from tierpoint.errors import NodeNotFound, UnknownNode
from tierpoint.states import ReplicaState, TierState

from .events import EventKind, record
from .models import Checkpoint, CheckpointTier, Job, Node, Replica, Shard
from .peer_reads import held_peer_checkpoints, placing_peer_copies


def all_seen_since(session: Session, node_ids: Sequence[str], since: datetime) -> bool:
    """Every one of `node_ids` has reported in at or after `since` (the catalog's clock)."""
    seen = session.scalar(
        select(func.count()).where(Node.id.in_(list(node_ids)), Node.last_seen_at >= since)
    )
    return int(seen or 0) == len(set(node_ids))


def upsert_node(
    session: Session,
    node_id: str,
    local_roots: dict[str, Any],
    data_url: str | None = None,
    failure_domain: str | None = None,
) -> None:
    upsert_nodes(session, {node_id: local_roots}, {node_id: data_url}, {node_id: failure_domain})


def upsert_nodes(
    session: Session,
    roots_by_node: Mapping[str, dict[str, Any]],
    data_urls: Mapping[str, str | None] | None = None,
    domains: Mapping[str, str | None] | None = None,
) -> None:
    """Report every one of these nodes in, in one statement (a worker process serving many
    nodes' queues reports them in together), with each node's data endpoint where it serves one
    and its failure domain. Never clears lost_at: a node declared lost stays lost."""
    if not roots_by_node:
        return
    urls = data_urls or {}
    labels = domains or {}
    # Sorted, so two processes reporting overlapping nodes lock their rows in the same order.
    rows = [
        {
            "id": n,
            "local_roots": r,
            "last_seen_at": func.now(),
            "data_url": urls.get(n),
            "failure_domain": labels.get(n),
        }
        for n, r in sorted(roots_by_node.items())
    ]
    stmt = insert(Node).values(rows)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[Node.id],
            set_={
                "local_roots": stmt.excluded.local_roots,
                "last_seen_at": func.now(),
                "failure_domain": stmt.excluded.failure_domain,
                "data_url": stmt.excluded.data_url,
            },
        )
    )


def failure_domains(session: Session, node_ids: Iterable[str]) -> dict[str, str | None]:
    """node -> the failure domain it reported (None: a domain of its own), for these nodes."""
    wanted = sorted(set(node_ids))
    if not wanted:
        return {}
    rows = session.execute(select(Node.id, Node.failure_domain).where(Node.id.in_(wanted)))
    return {n: d for n, d in rows}


def lost_among(session: Session, node_ids: Iterable[str]) -> list[str]:
    """Which of these nodes are lost. Takes a share lock on their rows until commit, so a caller
    that plans work for them either sees a declaration that committed first or commits before it
    (and `mark_lost` then sees what the caller wrote)."""
    wanted = sorted(set(node_ids))
    if not wanted:
        return []
    rows = session.execute(
        select(Node.id, Node.lost_at).where(Node.id.in_(wanted)).with_for_update(read=True)
    ).all()
    return sorted(n for n, lost_at in rows if lost_at is not None)


def require_known(session: Session, node_id: str) -> None:
    """UnknownNode unless a worker of `node_id` has reported in: a reader naming a node nobody
    knows (a typo, another cluster's name) would be answered as if it held no local copies."""
    known = session.scalar(select(exists().where(Node.id == node_id)))
    if not known:
        raise UnknownNode(
            f"node {node_id!r} is unknown: a node is known once its worker has reported in",
            errors=[
                {
                    "field": "node",
                    "location": "query",
                    "message": f"node {node_id!r} is unknown",
                    "code": "unknown_node",
                }
            ],
            extra={"nodes": [node_id]},
        )


def is_lost(session: Session, node_id: str) -> bool:
    return bool(session.scalar(select(Node.lost_at.is_not(None)).where(Node.id == node_id)))


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


def lost_reason(node: str) -> str:
    return f"node {node} was declared lost: its local copies are gone"


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
    # Checkpoints still placing peer copies: their lifecycle may have planned one on the node,
    # and nothing of it is in the catalog yet. Told like the others (so that none waits on the
    # node's queue), and re-replicated once their lifecycle has placed the rest.
    placing = placing_peer_copies(session, peer_tiers)
    ids = sorted(set(lost_per_checkpoint) | set(pending) | {cp for cp, _, _ in placing})
    if not ids:
        if changed:
            record(
                session, EventKind.NODE_LOST, actor=actor, detail={"node": node, "checkpoints": 0}
            )
        return NodeLost(node, lost_at, changed, 0, 0)

    # A local copy lost bytes only if the node wrote shards of it. A checkpoint of which the node
    # held only peer copies keeps its local copies on their own nodes, intact and restorable.
    own = sorted({cp for cp, tier in lost_rows if tier in local_tiers} | set(pending))
    failed_tiers = _fail_local_markers(session, own, local_tiers, reason)
    held = _fail_held_peer_markers(session, node, peer_tiers, reason)
    for cp, tiers in held.items():
        failed_tiers.setdefault(cp, []).extend(tiers)
    markers_failed = sum(len(t) for t in failed_tiers.values())
    out = NodeLost(node, lost_at, changed, replicas_lost, markers_failed)
    # Asked again on every declaration, so that repeating it re-starts what Temporal missed.
    out.peer_copies_lost = sorted(
        set(held_peer_checkpoints(session, node, peer_tiers)) | set(placing)
    )
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
        Shard.checkpoint_id == CheckpointTier.checkpoint_id, Shard.node_id == node
    )
    return (
        session.scalars(
            select(CheckpointTier.checkpoint_id)
            .where(CheckpointTier.state == TierState.PENDING.value, has_shard_there)
            .distinct()
        )
    ).all()


def _fail_local_markers(
    session: Session, ids: Sequence[int], local_tiers: Sequence[str], reason: str
) -> dict[int, list[str]]:
    """The local tiers' pending or restorable markers of `ids` turned `failed`, per checkpoint."""
    failed = (
        session.execute(
            update(CheckpointTier)
            .where(
                CheckpointTier.checkpoint_id.in_(ids),
                CheckpointTier.tier.in_(list(local_tiers)),
                CheckpointTier.state.in_([TierState.PENDING.value, TierState.RESTORABLE.value]),
            )
            .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
            .returning(CheckpointTier.checkpoint_id, CheckpointTier.tier)
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
        Replica.checkpoint_id == CheckpointTier.checkpoint_id,
        Replica.tier == CheckpointTier.tier,
        Replica.node_id == node,
        Replica.state == ReplicaState.LOST.value,
    )
    failed = (
        session.execute(
            update(CheckpointTier)
            .where(
                CheckpointTier.tier.in_(list(peer_tiers)),
                CheckpointTier.state.in_([TierState.PENDING.value, TierState.RESTORABLE.value]),
                held,
            )
            .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
            .returning(CheckpointTier.checkpoint_id, CheckpointTier.tier)
        )
    ).all()
    out: dict[int, list[str]] = {}
    for cp, tier in failed:
        out.setdefault(cp, []).append(tier)
    return out


def _affected(session: Session, ids: Sequence[int]) -> Sequence[Any]:
    """(id, job id, job name, step, still in flight) of each checkpoint of `ids`, by id."""
    still_pending = exists().where(
        CheckpointTier.checkpoint_id == Checkpoint.id,
        CheckpointTier.state == TierState.PENDING.value,
    )
    return (
        session.execute(
            select(Checkpoint.id, Checkpoint.job_id, Job.name, Checkpoint.step, still_pending)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.id.in_(ids))
            .order_by(Checkpoint.id)
        )
    ).all()


def verified_on_live_nodes() -> Any:
    """A condition on Replica: not a local copy on a node declared lost (copies on shared tiers
    have no node)."""
    return ~exists().where(and_(Node.id == Replica.node_id, Node.lost_at.is_not(None)))
