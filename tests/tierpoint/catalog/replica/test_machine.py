"""A shard's replica on a tier as the seal and copy activities write it: many replicas upserted in
one call (one statement, the rows as its parameters), the rules a copy run again must keep, and a
node declared lost, which no late copy on it can bring back."""

from __future__ import annotations

import uuid

from sqlalchemy import event, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import (
    SHARDS,
    checkpoint_of_shards,
    declare_lost,
    lustre_write,
    one_shard_checkpoint,
    replica_state,
    replicas_on,
    write_replica,
)
from tierpoint.catalog.models import Replica
from tierpoint.catalog.replica.machine import upsert_replicas
from tierpoint.states import ReplicaState


def test_a_lost_replica_stays_lost_whatever_a_late_copy_writes(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write_replica(session, cp, shard, node, ReplicaState.COPYING)
    declare_lost(session, node)
    session.execute(update(Replica).where(Replica.shard_id == shard).values(state="lost"))
    for state in (ReplicaState.VERIFIED, ReplicaState.COPYING, ReplicaState.PENDING):
        write_replica(session, cp, shard, node, state)
        assert replica_state(session, shard) == "lost"


def test_a_replica_first_written_after_its_node_was_declared_lost_is_lost(
    session: Session,
) -> None:
    """A seal that began before the declaration writes its first rows after it (the declaration
    marked none: there were none): they are lost, never verified. Found by the stateful test."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    declare_lost(session, node)
    write_replica(session, cp, shard, node, ReplicaState.VERIFIED)
    assert replica_state(session, shard) == "lost"


def test_a_replica_lost_on_a_live_node_is_copied_again(session: Session) -> None:
    """Lost for another reason than its node (reconciliation found its bytes gone): repair's
    copy brings it back."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write_replica(session, cp, shard, node, ReplicaState.VERIFIED)
    session.execute(update(Replica).where(Replica.shard_id == shard).values(state="lost"))
    write_replica(session, cp, shard, node, ReplicaState.COPYING)
    assert replica_state(session, shard) == "copying"
    write_replica(session, cp, shard, node, ReplicaState.VERIFIED)
    assert replica_state(session, shard) == "verified"


def test_many_replicas_in_one_call_each_with_its_own_state(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint_of_shards(session, node)
    states = [ReplicaState.VERIFIED, ReplicaState.COPYING, ReplicaState.PENDING] * 2
    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            lustre_write(s, st, node, done=i)
            for i, (s, st) in enumerate(zip(shards, states, strict=True))
        ],
    )
    got = replicas_on(session, "lustre", shards)
    assert [got[s].state for s in shards] == [st.value for st in states]
    assert [got[s].bytes_done for s in shards] == list(range(SHARDS))
    assert [got[s].location for s in shards] == [f"/lustre/s{s}" for s in shards]
    # The verification time is the catalog's, and only a verified replica has one.
    assert [got[s].verified_at is not None for s in shards] == [
        st is ReplicaState.VERIFIED for st in states
    ]
    upsert_replicas(session, cp, "lustre", [])  # an empty flush runs no statement


def test_a_copy_run_again_keeps_what_it_must(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, (verified, expiring, copying, pending, *_) = checkpoint_of_shards(session, node)
    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            lustre_write(verified, ReplicaState.VERIFIED, node),
            lustre_write(expiring, ReplicaState.VERIFIED, node),
            lustre_write(copying, ReplicaState.COPYING, node, done=7),
            lustre_write(pending, ReplicaState.PENDING, node, done=0),
        ],
    )
    session.execute(update(Replica).where(Replica.shard_id == expiring).values(state="expiring"))
    first_verified_at = replicas_on(session, "lustre", [verified])[verified].verified_at

    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            lustre_write(verified, ReplicaState.COPYING, node, done=0),
            lustre_write(expiring, ReplicaState.PENDING, node, done=0),
            lustre_write(copying, ReplicaState.COPYING, node, done=0),
            lustre_write(pending, ReplicaState.VERIFIED, node),
        ],
    )
    got = replicas_on(session, "lustre", [verified, expiring, copying, pending])
    # A verified replica is never downgraded by a copy, one being expired is retention's.
    assert got[verified].state == "verified" and got[verified].verified_at == first_verified_at
    assert got[expiring].state == "expiring"
    # A copy that starts again keeps showing the progress it had.
    assert got[copying].state == "copying" and got[copying].bytes_done == 7
    assert got[pending].state == "verified" and got[pending].verified_at is not None


def test_a_flush_that_writes_a_shard_twice_leaves_it_as_written_in_order(session: Session) -> None:
    """A progress flush holds a shard's `copying` and then its `verified` (a small shard is done
    within one interval): the rows reach the catalog as if written one by one, in order."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, (a, b, c, *_) = checkpoint_of_shards(session, node)
    upsert_replicas(session, cp, "lustre", [lustre_write(c, ReplicaState.COPYING, node, done=4)])
    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            lustre_write(a, ReplicaState.COPYING, node, done=0),
            lustre_write(b, ReplicaState.COPYING, node, done=0),
            lustre_write(a, ReplicaState.VERIFIED, node),
            lustre_write(c, ReplicaState.PENDING, node, done=0),
            lustre_write(c, ReplicaState.COPYING, node, done=0),
            lustre_write(b, ReplicaState.PENDING, node, done=0),
        ],
    )
    got = replicas_on(session, "lustre", [a, b, c])
    assert got[a].state == "verified" and got[a].verified_at is not None
    assert got[b].state == "pending" and got[b].verified_at is None
    # pending wrote 0, and the copy that started after it kept that progress.
    assert got[c].state == "copying" and got[c].bytes_done == 0


def test_a_flush_is_one_statement_per_run_not_one_per_row(session: Session) -> None:
    """The rows of a flush go in one statement (two here: a shard written twice starts a second
    one), not one execution per row: that was the catalog's largest cost per checkpoint."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint_of_shards(session, node)
    executions: list[bool] = []
    engine = session.connection().engine

    def count(_c: object, _cur: object, stmt: str, _p: object, _ctx: object, many: bool) -> None:
        if stmt.lstrip().upper().startswith("INSERT INTO REPLICA"):
            executions.append(many)

    event.listen(engine, "before_cursor_execute", count)
    try:
        writes = [lustre_write(s, ReplicaState.COPYING, node) for s in shards]
        writes += [lustre_write(s, ReplicaState.VERIFIED, node) for s in shards]
        upsert_replicas(session, cp, "lustre", writes)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert executions == [False, False]
    assert {r.state for r in replicas_on(session, "lustre", shards).values()} == {"verified"}
