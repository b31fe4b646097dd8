"""A checkpoint's shards as a copy batch reads them: the range of one node's shards, each with its
replica on the destination and on the source tier."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import SHARDS, checkpoint_of_shards, lustre_write
from tierpoint.catalog.checkpoint.shards import batch_shards
from tierpoint.catalog.replica.machine import upsert_replicas
from tierpoint.states import ReplicaState


def test_batch_shards_reads_the_range_with_both_tiers_replicas(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shards = checkpoint_of_shards(session, node)
    upsert_replicas(
        session, cp, "ssd", [lustre_write(s, ReplicaState.VERIFIED, node) for s in shards]
    )
    upsert_replicas(session, cp, "lustre", [lustre_write(shards[2], ReplicaState.COPYING, node)])

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
