"""The catalog's one lock order on a real catalog: nodes, checkpoints, tier copies, replicas.
A writer continuing its lock set may only go on to later kinds, and what it locked is what
exists."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import declare_lost, one_shard_checkpoint
from tierpoint.catalog.locks import CheckpointsOf, lock_checkpoint, lock_in_order
from tierpoint.catalog.models import Checkpoint


def test_rows_are_locked_only_in_the_catalogs_order(session: Session) -> None:
    cid, _ = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    held = lock_in_order(session, tier_copies=[(cid, "ssd")])
    with pytest.raises(AssertionError, match="out of the catalog's order"):
        lock_in_order(session, checkpoints=[cid], into=held)
    with pytest.raises(AssertionError, match="out of the catalog's order"):
        lock_in_order(session, tier_copies=[(cid, "ssd")], into=held)
    lock_in_order(session, replicas=[0], into=held)  # later kinds may follow


def test_a_lock_set_holds_what_exists_and_names_the_lost_nodes(session: Session) -> None:
    alive, lost = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    cid, _ = one_shard_checkpoint(session, alive)
    one_shard_checkpoint(session, lost)
    declare_lost(session, lost)
    job_id = session.get_one(Checkpoint, cid).job_id
    held = lock_in_order(
        session,
        nodes=[lost, alive, "no-such-node"],
        checkpoints=CheckpointsOf(job_id),
        tier_copies="every",
    )
    assert sorted(held.nodes) == sorted([alive, lost])
    assert held.lost_nodes == [lost]
    assert list(held.checkpoints) == [cid]
    assert held.checkpoints[cid].step == 1
    assert list(held.tier_copies) == [(cid, "ssd")]
    assert held.tier_copies[(cid, "ssd")].state == "pending"
    assert lock_checkpoint(session, cid)
    assert not lock_checkpoint(session, -1)
