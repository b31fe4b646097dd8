"""Promotion of a tier copy on a real catalog: only verified replicas on nodes that are not lost
count."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import declare_lost, one_shard_checkpoint, write_replica
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.states import ReplicaState, TierState


def test_promote_never_counts_a_verified_copy_on_a_lost_node(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    write_replica(session, cp, shard, node, ReplicaState.VERIFIED)
    declare_lost(session, node)
    outcome = promote(session, cp, "ssd", [], None)
    assert outcome.state == TierState.FAILED.value
    assert "1 of 1 shards have no verified replica on ssd" in (outcome.reason or "")

    # The same copy on a node that is not lost is promoted.
    other = f"node-{uuid.uuid4().hex[:8]}"
    cp2, shard2 = one_shard_checkpoint(session, other)
    write_replica(session, cp2, shard2, other, ReplicaState.VERIFIED)
    assert promote(session, cp2, "ssd", [], None).state == TierState.RESTORABLE.value
