"""The copy activities' catalog writes and reads per batch: many replicas of a tier upserted in one
call (one statement, the rows as its parameters), with the rules a copy run again must keep, and
the batch's shards read with their replicas on the destination and the source tier."""

from __future__ import annotations

import uuid

from sqlalchemy import event, insert, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint.shards import batch_shards
from tierpoint.catalog.models import Checkpoint, Job, Replica, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.states import ReplicaState

SHARDS = 6


def checkpoint(session: Session, node: str) -> tuple[int, list[int]]:
    """(checkpoint id, shard ids by ordinal) of a checkpoint of SHARDS shards on `node`."""
    upsert_node(session, node, {})
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    cp = session.scalar(
        insert(Checkpoint)
        .values(
            job_id=job_id, step=1, total_bytes=10 * SHARDS, shard_count=SHARDS, manifest_digest="d"
        )
        .returning(Checkpoint.id)
    )
    assert cp is not None
    ids = [
        session.scalar(
            insert(Shard)
            .values(
                checkpoint_id=cp,
                ordinal=i,
                path=f"s{i}",
                size=10,
                checksum=f"{i:08x}",
                node_id=node,
            )
            .returning(Shard.id)
        )
        for i in range(SHARDS)
    ]
    return cp, [i for i in ids if i is not None]


def rows(session: Session, tier: str, shards: list[int]) -> dict[int, Replica]:
    found = session.scalars(
        select(Replica).where(Replica.tier == tier, Replica.shard_id.in_(shards))
    )
    return {r.shard_id: r for r in found}


def w(shard: int, state: ReplicaState, node: str, done: int = 10) -> ReplicaWrite:
    return ReplicaWrite(shard, state, f"/lustre/s{shard}", node, bytes_done=done)


def test_many_replicas_in_one_call_each_with_its_own_state(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint(session, node)
    states = [ReplicaState.VERIFIED, ReplicaState.COPYING, ReplicaState.PENDING] * 2
    upsert_replicas(
        session,
        cp,
        "lustre",
        [w(s, st, node, done=i) for i, (s, st) in enumerate(zip(shards, states, strict=True))],
    )
    got = rows(session, "lustre", shards)
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
    cp, (verified, expiring, copying, pending, *_) = checkpoint(session, node)
    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            w(verified, ReplicaState.VERIFIED, node),
            w(expiring, ReplicaState.VERIFIED, node),
            w(copying, ReplicaState.COPYING, node, done=7),
            w(pending, ReplicaState.PENDING, node, done=0),
        ],
    )
    session.execute(update(Replica).where(Replica.shard_id == expiring).values(state="expiring"))
    first_verified_at = rows(session, "lustre", [verified])[verified].verified_at

    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            w(verified, ReplicaState.COPYING, node, done=0),
            w(expiring, ReplicaState.PENDING, node, done=0),
            w(copying, ReplicaState.COPYING, node, done=0),
            w(pending, ReplicaState.VERIFIED, node),
        ],
    )
    got = rows(session, "lustre", [verified, expiring, copying, pending])
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
    cp, (a, b, c, *_) = checkpoint(session, node)
    upsert_replicas(session, cp, "lustre", [w(c, ReplicaState.COPYING, node, done=4)])
    upsert_replicas(
        session,
        cp,
        "lustre",
        [
            w(a, ReplicaState.COPYING, node, done=0),
            w(b, ReplicaState.COPYING, node, done=0),
            w(a, ReplicaState.VERIFIED, node),
            w(c, ReplicaState.PENDING, node, done=0),
            w(c, ReplicaState.COPYING, node, done=0),
            w(b, ReplicaState.PENDING, node, done=0),
        ],
    )
    got = rows(session, "lustre", [a, b, c])
    assert got[a].state == "verified" and got[a].verified_at is not None
    assert got[b].state == "pending" and got[b].verified_at is None
    # pending wrote 0, and the copy that started after it kept that progress.
    assert got[c].state == "copying" and got[c].bytes_done == 0


def test_a_flush_is_one_statement_per_run_not_one_per_row(session: Session) -> None:
    """The rows of a flush go in one statement (two here: a shard written twice starts a second
    one), not one execution per row: that was the catalog's largest cost per checkpoint."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint(session, node)
    executions: list[bool] = []
    engine = session.connection().engine

    def count(_c: object, _cur: object, stmt: str, _p: object, _ctx: object, many: bool) -> None:
        if stmt.lstrip().upper().startswith("INSERT INTO REPLICA"):
            executions.append(many)

    event.listen(engine, "before_cursor_execute", count)
    try:
        writes = [w(s, ReplicaState.COPYING, node) for s in shards]
        writes += [w(s, ReplicaState.VERIFIED, node) for s in shards]
        upsert_replicas(session, cp, "lustre", writes)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert executions == [False, False]
    assert {r.state for r in rows(session, "lustre", shards).values()} == {"verified"}


def test_batch_shards_reads_the_range_with_both_tiers_replicas(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint(session, node)
    upsert_replicas(session, cp, "ssd", [w(s, ReplicaState.VERIFIED, node) for s in shards])
    upsert_replicas(session, cp, "lustre", [w(shards[2], ReplicaState.COPYING, node)])

    batch = batch_shards(session, cp, node, 1, 3, "lustre", source_tier="ssd")
    assert [(b.ordinal, b.path, b.size, b.node_id) for b in batch] == [
        (i, f"s{i}", 10, node) for i in (1, 2, 3)
    ]
    assert [b.source_state for b in batch] == ["verified"] * 3
    assert [b.state for b in batch] == [None, "copying", None]

    # The first tier has no source: the seal reads its shards alone.
    sealed = batch_shards(session, cp, node, 0, SHARDS - 1, "ssd")
    assert [b.ordinal for b in sealed] == list(range(SHARDS))
    assert {b.source_state for b in sealed} == {None} and {b.state for b in sealed} == {"verified"}
    assert batch_shards(session, cp, "another-node", 0, SHARDS - 1, "ssd") == []
