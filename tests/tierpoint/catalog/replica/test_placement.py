"""Where a checkpoint's replicas are held, on a real catalog: a node's data endpoint serves only
its own verified copies; the shards still without a verified copy on a tier; where a copy made
again may read from (verified, on a node not lost, in a tier copy neither quarantined nor
expiring); who holds a node's peer copies; and which checkpoints placement and re-replication
still have to handle."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_of_shards, declare_lost
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.replica.placement import (
    copy_holders,
    held_peer_checkpoints,
    placing_peer_copies,
    served_replica,
    served_sizes,
    verified_copies,
    without_verified_copy,
)
from tierpoint.states import ReplicaState

V, C, CORRUPT, LOST = (
    ReplicaState.VERIFIED,
    ReplicaState.COPYING,
    ReplicaState.CORRUPT,
    ReplicaState.LOST,
)


def _node(session: Session) -> str:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    return node


def _checkpoint(session: Session) -> tuple[int, str, str, list[int]]:
    """(checkpoint id, job name, its node, shard ids) of a fresh six-shard checkpoint."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint_of_shards(session, node)
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return cp, job, node, shards


def _write(
    session: Session, cp: int, tier: str, writes: Sequence[tuple[int, ReplicaState, str | None]]
) -> None:
    upsert_replicas(
        session, cp, tier, [ReplicaWrite(s, st, f"/{tier}/{s}", n, 10) for s, st, n in writes]
    )


def _tier_copy(session: Session, cp: int, tier: str, state: str) -> None:
    c = session.get_one(Checkpoint, cp)
    session.execute(
        insert(TierCopy).values(
            checkpoint_id=cp, tier=tier, job_id=c.job_id, step=c.step, state=state
        )
    )


def test_a_node_serves_only_its_own_verified_copies(session: Session) -> None:
    cp, job, owner, shards = _checkpoint(session)
    holder = _node(session)
    _write(session, cp, "ssd", [(shards[0], V, owner), (shards[1], C, owner)])
    _write(session, cp, "peer", [(shards[2], V, holder)])
    assert served_sizes(session, owner, "ssd", job, 1) == {"s0": 10}
    assert served_sizes(session, holder, "ssd", job, 1) == {}
    assert served_sizes(session, holder, "peer", job, 1) == {"s2": 10}
    assert served_sizes(session, owner, "ssd", job, 1, branch=2) == {}
    found = served_replica(session, owner, "ssd", job, 1, "s0")
    assert found is not None and found[1] == cp
    assert served_replica(session, owner, "ssd", job, 1, "s1") is None  # still copying
    assert served_replica(session, holder, "ssd", job, 1, "s0") is None  # not its copy


def test_the_shards_a_tier_still_lacks_and_where_they_can_be_read_again(
    session: Session,
) -> None:
    cp, _, owner, shards = _checkpoint(session)
    gone = _node(session)
    for tier in ("ssd", "lustre", "s3"):
        _tier_copy(session, cp, tier, "restorable")
    _write(session, cp, "ssd", [(s, V, owner) for s in shards[:3]] + [(shards[3], CORRUPT, owner)])
    _write(session, cp, "lustre", [(shards[0], V, None), (shards[4], V, None)])
    _write(session, cp, "s3", [(shards[1], V, None)])
    _write(session, cp, "peer", [(shards[2], V, gone)])
    declare_lost(session, gone)

    missing = without_verified_copy(session, cp, "ssd")
    assert missing == [(owner, 3, 10), (owner, 4, 10), (owner, 5, 10)]

    readable = verified_copies(session, cp, [owner], ["ssd", "lustre", "s3", "peer"])
    assert readable == {
        (owner, 0): {"ssd": owner, "lustre": None},
        (owner, 1): {"ssd": owner, "s3": None},
        # Its peer copy went with the lost node: only the local one is left.
        (owner, 2): {"ssd": owner},
        (owner, 4): {"lustre": None},
    }
    # A quarantined or expiring tier copy is no source.
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "lustre")
        .values(quarantine_reason="suspect")
    )
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "s3")
        .values(state="expiring")
    )
    readable = verified_copies(session, cp, [owner], ["lustre", "s3"])
    assert readable == {}
    assert verified_copies(session, cp, [], ["ssd"]) == {}


def test_who_holds_a_nodes_peer_copies_and_what_is_left_to_place_or_copy_again(
    session: Session,
) -> None:
    cp, job, owner, shards = _checkpoint(session)
    keeper, copier, lost = (_node(session) for _ in range(3))
    _tier_copy(session, cp, "peer.1", "pending")
    _tier_copy(session, cp, "peer.2", "failed")
    _write(session, cp, "peer.1", [(shards[0], V, keeper), (shards[1], C, copier)])
    _write(session, cp, "peer.2", [(shards[0], LOST, lost)])
    declare_lost(session, lost)

    assert copy_holders(session, cp, ["peer.1", "peer.2"]) == {owner: {"peer.1": {keeper, copier}}}
    assert copy_holders(session, cp, []) == {}
    assert (cp, job, 1, 1) in placing_peer_copies(session, ["peer.1", "peer.2"])
    assert placing_peer_copies(session, ["peer.2"], cp) == []
    assert placing_peer_copies(session, []) == []
    assert held_peer_checkpoints(session, lost, ["peer.1", "peer.2"]) == [(cp, job, 1, 1)]
    assert held_peer_checkpoints(session, keeper, ["peer.1", "peer.2"]) == []
