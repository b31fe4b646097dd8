"""Where a checkpoint's replicas are held: what a node serves over its data endpoint (registered,
verified files only), which nodes hold a node's peer copies, where a copy made again can be read
from, and which copies a lost node took with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard, TierCopy
from tierpoint.states import ReplicaState, TierState


def served_sizes(
    session: Session, node: str, tier: str, job: str, step: int, branch: int = 1
) -> dict[str, int]:
    """path -> size of every shard of `job`/`step` of which `node` holds a verified copy on
    `tier`: what the data endpoint serves of that checkpoint (registered, verified files only),
    in one query for the whole checkpoint, as a restore reads all of its files."""
    rows = session.execute(
        select(Shard.path, Shard.size)
        .join(Checkpoint, Checkpoint.id == Shard.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .join(Replica, Replica.shard_id == Shard.id)
        .where(
            Job.name == job,
            Checkpoint.step == step,
            Checkpoint.branch == branch,
            Replica.tier == tier,
            # guard: data-endpoint-verified-only
            Replica.node_id == node,
            Replica.state == ReplicaState.VERIFIED.value,
        )
    )
    return {r.path: r.size for r in rows}


def served_replica(
    session: Session, node: str, tier: str, job: str, step: int, path: str, branch: int = 1
) -> tuple[int, int] | None:
    """(replica id, checkpoint id) of `node`'s verified copy of that file on `tier`, which the
    data endpoint serves; None if it holds none (any more)."""
    row = session.execute(
        select(Replica.id, Replica.checkpoint_id)
        .join(Shard, Shard.id == Replica.shard_id)
        .join(Checkpoint, Checkpoint.id == Shard.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(
            Job.name == job,
            Checkpoint.step == step,
            Checkpoint.branch == branch,
            Shard.path == path,
            Replica.tier == tier,
            Replica.state == ReplicaState.VERIFIED.value,
            Replica.node_id == node,
        )
    ).first()
    return None if row is None else (row.id, row.checkpoint_id)


def without_verified_copy(
    session: Session, checkpoint_id: int, tier: str
) -> list[tuple[str, int, int]]:
    """(node, ordinal, size) of the checkpoint's shards with no verified replica on `tier`, by
    node and ordinal (what `plan_batches` takes)."""
    verified = exists().where(
        Replica.shard_id == Shard.id,
        Replica.tier == tier,
        Replica.state == ReplicaState.VERIFIED.value,
    )
    rows = session.execute(
        select(Shard.node_id, Shard.ordinal, Shard.size)
        .where(Shard.checkpoint_id == checkpoint_id, ~verified)
        .order_by(Shard.node_id, Shard.ordinal)
    )
    return [(r.node_id, r.ordinal, r.size) for r in rows]


def placing_peer_copies(
    session: Session, peer_tiers: Sequence[str], checkpoint_id: int | None = None
) -> list[tuple[int, str, int, int]]:
    """(id, job, step, branch) of checkpoints (or only `checkpoint_id`) whose lifecycle has not yet
    placed their copy on some peer tier (its tier copy there still `pending`): a copy it planned
    on a node lost since then is not in the catalog yet, and a copy made again meanwhile could
    not see where the lifecycle puts the others."""
    if not peer_tiers:
        return []
    q = (
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.branch)
        .join(TierCopy, TierCopy.checkpoint_id == Checkpoint.id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(
            TierCopy.tier.in_(list(peer_tiers)),
            TierCopy.state == TierState.PENDING.value,
        )
        .distinct()
        .order_by(Checkpoint.id)
    )
    if checkpoint_id is not None:
        q = q.where(Checkpoint.id == checkpoint_id)
    return [(r.id, r.name, r.step, r.branch) for r in session.execute(q)]


def held_peer_checkpoints(
    session: Session, node: str, peer_tiers: Sequence[str]
) -> list[tuple[int, str, int, int]]:
    """(id, job, step, branch) of checkpoints whose copy on a peer tier `node` held (now lost)
    and whose tier copy there failed: what re-replication copies again."""
    if not peer_tiers:
        return []
    held = exists().where(
        Replica.checkpoint_id == TierCopy.checkpoint_id,
        Replica.tier == TierCopy.tier,
        Replica.node_id == node,
        Replica.state == ReplicaState.LOST.value,
    )
    rows = session.execute(
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.branch)
        .join(TierCopy, TierCopy.checkpoint_id == Checkpoint.id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(
            TierCopy.tier.in_(list(peer_tiers)),
            TierCopy.state == TierState.FAILED.value,
            held,
        )
        .distinct()
        .order_by(Checkpoint.id)
    )
    return [(r.id, r.name, r.step, r.branch) for r in rows]


def verified_copies(
    session: Session, checkpoint_id: int, nodes: Sequence[str], tiers: Sequence[str]
) -> dict[tuple[str, int], dict[str, str | None]]:
    """(node, ordinal) -> tier -> where, for each of `tiers` that holds that shard of `nodes`
    verified, on a node not lost (None: a tier off the nodes), in a copy of the checkpoint that is
    neither quarantined nor being expired: where re-replication may read the shards from (a
    node's local copy, another peer tier's holder, the shared tier, S3)."""
    if not nodes or not tiers:
        return {}
    usable = exists().where(
        TierCopy.checkpoint_id == Replica.checkpoint_id,
        TierCopy.tier == Replica.tier,
        TierCopy.quarantine_reason.is_(None),
        TierCopy.state.not_in([TierState.EXPIRING.value, TierState.EXPIRED.value]),
    )
    rows = session.execute(
        select(Shard.node_id, Shard.ordinal, Replica.tier, Replica.node_id)
        .join(Replica, Replica.shard_id == Shard.id)
        .where(
            Shard.checkpoint_id == checkpoint_id,
            Shard.node_id.in_(list(nodes)),
            # guard: rereplicate-below-verified-only
            Replica.tier.in_(list(tiers)),
            Replica.state == ReplicaState.VERIFIED.value,
            usable,
            not_on_lost_node(),
        )
    )
    out: dict[tuple[str, int], dict[str, str | None]] = {}
    for node, ordinal, tier, at in rows:
        out.setdefault((node, ordinal), {})[tier] = at
    return out


# A replica in these states keeps its node as the home of that tier's copy of the shard.
_HOMED = [
    ReplicaState.PENDING.value,
    ReplicaState.COPYING.value,
    ReplicaState.VERIFIED.value,
    ReplicaState.CORRUPT.value,
]


def copy_holders(
    session: Session, checkpoint_id: int, tiers: Sequence[str]
) -> dict[str, dict[str, set[str]]]:
    """shard node -> peer tier -> the nodes not lost holding (or copying, or to repair) that node's
    copies of the checkpoint there: where a new copy of the node's shards must not go."""
    if not tiers:
        return {}
    rows = session.execute(
        select(Shard.node_id, Replica.tier, Node.id)
        .join(Replica, Replica.shard_id == Shard.id)
        .join(Node, Node.id == Replica.node_id)
        .where(
            Shard.checkpoint_id == checkpoint_id,
            Replica.checkpoint_id == checkpoint_id,
            Replica.tier.in_(list(tiers)),
            Replica.state.in_(_HOMED),
            Node.lost_at.is_(None),
        )
        .distinct()
    )
    out: dict[str, dict[str, set[str]]] = {}
    for node, tier, holder in rows:
        out.setdefault(node, {}).setdefault(tier, set()).add(holder)
    return out


def not_on_lost_node() -> Any:
    """A condition on Replica: not a copy on a node declared lost (copies on shared tiers have
    no node)."""
    return ~exists().where(and_(Node.id == Replica.node_id, Node.lost_at.is_not(None)))
