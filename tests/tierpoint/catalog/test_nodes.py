"""The catalog's guards around a node declared lost, for writers that do not know yet: a copy
still running on the node cannot bring its replica back, promote never counts a copy there, and a
plan reads which of its nodes are lost. (The declaration itself: tests/api/test_node_lost.py.)"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import lost_among, upsert_node, upsert_nodes
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.states import ReplicaState, TierState


def one_shard_checkpoint(session: Session, node: str) -> tuple[int, int]:
    """(checkpoint id, shard id) of a one-shard checkpoint on `node` with a pending ssd marker."""
    upsert_node(session, node, {})
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=1, total_bytes=10, shard_count=1, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    shard = session.scalar(
        insert(Shard)
        .values(checkpoint_id=cp, ordinal=0, path="a", size=10, checksum="0badf00d", node_id=node)
        .returning(Shard.id)
    )
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="ssd", job_id=job_id, step=1))
    assert cp is not None and shard is not None
    return cp, shard


def declare_lost(session: Session, node: str) -> None:
    session.execute(update(Node).where(Node.id == node).values(lost_at=func.now()))


def write(session: Session, cp: int, shard: int, node: str, state: ReplicaState) -> None:
    w = ReplicaWrite(shard, state, f"/ssd/{node}/a", node, bytes_done=10)
    upsert_replicas(session, cp, "ssd", [w])


def replica_state(session: Session, shard: int) -> str | None:
    return session.scalar(select(Replica.state).where(Replica.shard_id == shard))


def test_a_lost_replica_stays_lost_whatever_a_late_copy_writes(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write(session, cp, shard, node, ReplicaState.COPYING)
    declare_lost(session, node)
    session.execute(update(Replica).where(Replica.shard_id == shard).values(state="lost"))
    for state in (ReplicaState.VERIFIED, ReplicaState.COPYING, ReplicaState.PENDING):
        write(session, cp, shard, node, state)
        assert replica_state(session, shard) == "lost"


def test_a_replica_first_written_after_its_node_was_declared_lost_is_lost(
    session: Session,
) -> None:
    """A seal that began before the declaration writes its first rows after it (the declaration
    marked none: there were none): they are lost, never verified. Found by the stateful test."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    declare_lost(session, node)
    write(session, cp, shard, node, ReplicaState.VERIFIED)
    assert replica_state(session, shard) == "lost"


def test_a_replica_lost_on_a_live_node_is_copied_again(session: Session) -> None:
    """Lost for another reason than its node (reconciliation found its bytes gone): repair's
    copy brings it back."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write(session, cp, shard, node, ReplicaState.VERIFIED)
    session.execute(update(Replica).where(Replica.shard_id == shard).values(state="lost"))
    write(session, cp, shard, node, ReplicaState.COPYING)
    assert replica_state(session, shard) == "copying"
    write(session, cp, shard, node, ReplicaState.VERIFIED)
    assert replica_state(session, shard) == "verified"


def test_promote_never_counts_a_verified_copy_on_a_lost_node(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write(session, cp, shard, node, ReplicaState.VERIFIED)
    declare_lost(session, node)
    outcome = promote(session, cp, "ssd", [], None)
    assert outcome.state == TierState.FAILED.value
    assert "1 of 1 shards have no verified replica on ssd" in (outcome.reason or "")

    # The same copy on a node that is not lost is promoted.
    other = f"node-{uuid.uuid4().hex[:8]}"
    cp2, shard2 = one_shard_checkpoint(session, other)
    write(session, cp2, shard2, other, ReplicaState.VERIFIED)
    assert promote(session, cp2, "ssd", [], None).state == TierState.RESTORABLE.value


def test_lost_among_names_only_the_lost_nodes(session: Session) -> None:
    gone, alive = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for n in (gone, alive):
        upsert_node(session, n, {})
    declare_lost(session, gone)
    assert lost_among(session, [alive, gone, gone, "never-reported"]) == [gone]
    assert lost_among(session, []) == []


def test_a_declaration_waits_for_a_seal_that_read_the_node_as_alive(catalog_engine: Engine) -> None:
    """The seal's share lock on the node row orders it with a declaration in flight: the
    declaration cannot commit between the seal's read of `lost_at` and its write, so it either
    sees the seal's rows (and marks them lost) or the seal sees the declaration."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    with Session(catalog_engine) as setup, setup.begin():
        cp, shard = one_shard_checkpoint(setup, node)
    with Session(catalog_engine) as seal, seal.begin():
        write(seal, cp, shard, node, ReplicaState.VERIFIED)
        with Session(catalog_engine) as operator, operator.begin():
            operator.execute(text("SET LOCAL lock_timeout = '300ms'"))
            with pytest.raises(OperationalError, match="lock timeout"):
                declare_lost(operator, node)
    with Session(catalog_engine) as operator, operator.begin():
        declare_lost(operator, node)
        assert lost_among(operator, [node]) == [node]


def test_nodes_reporting_in_together_are_all_seen_and_a_lost_one_stays_lost(
    session: Session,
) -> None:
    """A worker process serving many nodes' queues reports them in with one statement."""
    lost, live = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    upsert_node(session, lost, {})
    declare_lost(session, lost)
    session.execute(update(Node).values(last_seen_at=None).where(Node.id == lost))
    upsert_nodes(session, {live: {"ssd": "/l"}, lost: {"ssd": "/x"}})
    rows = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_([lost, live])))}
    assert rows[lost].lost_at is not None and rows[lost].last_seen_at is not None
    assert rows[lost].local_roots == {"ssd": "/x"}
    assert rows[live].lost_at is None and rows[live].local_roots == {"ssd": "/l"}


def test_a_lost_holder_fails_the_peer_copies_it_held_and_no_local_copy(session: Session) -> None:
    """The node held only a peer copy of the checkpoint: the local copy on the writer's node lost
    no byte and stays restorable; the peer copy is the one that failed (to be made again)."""
    writer, holder = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    cp, shard = one_shard_checkpoint(session, writer)
    upsert_node(session, holder, {})
    write(session, cp, shard, writer, ReplicaState.VERIFIED)
    assert promote(session, cp, "ssd", [], None).state == TierState.RESTORABLE.value
    job_id = session.scalar(select(Checkpoint.job_id).where(Checkpoint.id == cp))
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="peer", job_id=job_id, step=1))
    held = ReplicaWrite(shard, ReplicaState.VERIFIED, f"/peer/{holder}/a", holder, 10)
    upsert_replicas(session, cp, "peer", [held])
    assert promote(session, cp, "peer", [], None).state == TierState.RESTORABLE.value

    out = mark_lost(session, holder, ["ssd"], "ops", ["peer"])
    states = dict(
        session.execute(
            select(TierCopy.tier, TierCopy.state).where(TierCopy.checkpoint_id == cp)
        ).all()
    )
    assert states == {"ssd": "restorable", "peer": "failed"}, states
    assert (out.replicas_lost, out.tier_copies_failed) == (1, 1)
    assert [c.checkpoint_id for c in out.checkpoints] == [cp]
    assert [c for c, _, _ in out.peer_copies_lost] == [cp]

    # The writer itself lost: its local copy lost its bytes and fails.
    out = mark_lost(session, writer, ["ssd"], "ops", ["peer"])
    assert out.tier_copies_failed == 1
    assert (
        session.scalar(
            select(TierCopy.state).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
        )
        == TierState.FAILED.value
    )
