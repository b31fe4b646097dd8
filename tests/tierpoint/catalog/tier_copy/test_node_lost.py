"""What a node declared lost takes with it, on a real catalog: the tier copies whose bytes it held,
and nothing else."""

from __future__ import annotations

import uuid

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint, write_replica
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
