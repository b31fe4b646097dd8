"""What a node declared lost takes with it, on a real catalog: the tier copies whose bytes it held,
and nothing else."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.catalog_rows import one_shard_checkpoint, write_replica
from tests.helpers.expiry_races import WAIT_LIMIT, lock_waiters
from tierpoint.catalog.locks import EVERY_TIER_COPY, RowLock, lock_in_order
from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.states import ReplicaState, TierState


def test_a_lost_holder_fails_the_peer_copies_it_held_and_no_local_copy(session: Session) -> None:
    """The node held only a peer copy of the checkpoint: the local copy on the writer's node lost
    no byte and stays restorable; the peer copy is the one that failed (to be made again)."""
    writer, holder = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    cp, shard = one_shard_checkpoint(session, writer)
    upsert_node(session, holder, {})
    write_replica(session, cp, shard, writer, ReplicaState.VERIFIED)
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
    assert [c for c, *_ in out.peer_copies_lost] == [cp]

    # The writer itself lost: its local copy lost its bytes and fails.
    out = mark_lost(session, writer, ["ssd"], "ops", ["peer"])
    assert out.tier_copies_failed == 1
    assert (
        session.scalar(
            select(TierCopy.state).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
        )
        == TierState.FAILED.value
    )


def test_a_declaration_and_a_retention_holding_the_checkpoint_do_not_deadlock(
    sessions: sessionmaker[Session], engine: Engine
) -> None:
    """Retention locks a checkpoint's row FOR UPDATE, then its tier copies (two statements of
    `expiry._lock`); a declaration of a node lost between them waits for the row before it holds
    a tier copy. Holding the tier copies first, it waited for the row only when its events' foreign
    key took KEY SHARE there, while retention waited for the tier copy: Postgres ended one of them
    as deadlocked (the API answered the declaration 503)."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    with sessions.begin() as s:
        cp, shard = one_shard_checkpoint(s, node)
        write_replica(s, cp, shard, node, ReplicaState.VERIFIED)
        assert promote(s, cp, "ssd", [], None).state == TierState.RESTORABLE.value

    def declare() -> int:
        with sessions.begin() as s:
            return mark_lost(s, node, ["ssd"], "ops").tier_copies_failed

    with sessions() as retention, ThreadPoolExecutor(1) as pool:
        held = lock_in_order(retention, checkpoints=[cp], checkpoint_lock=RowLock.UPDATE)
        declared = pool.submit(declare)
        deadline = time.monotonic() + WAIT_LIMIT
        while not lock_waiters(engine):
            assert not declared.done(), declared.result()
            assert time.monotonic() < deadline, "the declaration never waited for the row"
            time.sleep(0.05)
        lock_in_order(retention, tier_copies=EVERY_TIER_COPY, into=held)
        assert held.tier_copies[(cp, "ssd")].state == TierState.RESTORABLE.value
        retention.commit()
        assert declared.result(timeout=WAIT_LIMIT) == 1
