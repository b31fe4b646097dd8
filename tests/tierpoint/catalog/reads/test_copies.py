"""One checkpoint's copy on one tier as the integrity checks see it, on a real catalog: its
verified replicas (a corrupt one not among them), one shard's replica there (on the timeline's
checkpoint or a named branch's, read back recently or not), and what became of a replica
reported bad with the sources a repair could copy from."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import supersede
from tierpoint.catalog.models import Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.copies import copy_state, find_copy, verified_replicas
from tierpoint.errors import CheckpointNotFound, CopyNotFound

HOUR = timedelta(hours=1)


def _checkpoint(session: Session, job_id: int, step: int, node: str, branch: int = 1) -> int:
    """A checkpoint of shards "a" and "b" with copies on ssd and lustre."""
    cp = checkpoint_row(session, job_id, step, tiers=("ssd", "lustre"), branch=branch)
    for i, path in enumerate(("a", "b")):
        session.execute(
            insert(Shard).values(checkpoint_id=cp, ordinal=i, path=path, size=5, node_id=node)
        )
    return cp


def _replica(session: Session, cp: int, path: str, tier: str, state: str, node: str) -> int:
    shard = session.scalar(select(Shard.id).where(Shard.checkpoint_id == cp, Shard.path == path))
    rid: int | None = session.scalar(
        insert(Replica)
        .values(
            shard_id=shard,
            checkpoint_id=cp,
            tier=tier,
            node_id=node if tier == "ssd" else None,
            state=state,
            location=f"/{tier}/{path}",
            bytes_done=5,
        )
        .returning(Replica.id)
    )
    assert rid is not None
    return rid


def _node(session: Session) -> str:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    return node


def test_a_corrupt_replica_is_not_counted_verified(session: Session) -> None:
    node = _node(session)
    job = job_row(session)
    cp = _checkpoint(session, job.id, 1, node)
    _replica(session, cp, "a", "ssd", "verified", node)
    _replica(session, cp, "b", "ssd", "corrupt", node)
    _replica(session, cp, "b", "lustre", "verified", node)

    assert verified_replicas(session, cp, "ssd") == 1
    assert verified_replicas(session, cp, "lustre") == 1
    assert verified_replicas(session, cp, "s3") == 0


def test_a_shards_copy_is_found_on_the_timeline_or_on_a_named_branch(session: Session) -> None:
    node = _node(session)
    job = job_row(session)
    old = _checkpoint(session, job.id, 3, node)
    supersede(session, job.id, [old], 2, 2, actor=None)
    new = _checkpoint(session, job.id, 3, node, branch=2)
    on_old = _replica(session, old, "a", "ssd", "verified", node)
    on_new = _replica(session, new, "a", "ssd", "verified", node)

    ref = find_copy(session, job.name, 3, "ssd", "a", HOUR)
    assert (ref.checkpoint_id, ref.job_id, ref.replica_id, ref.node) == (new, job.id, on_new, node)
    assert find_copy(session, job.name, 3, "ssd", "a", HOUR, branch=1).replica_id == on_old


def test_recently_read_is_a_scrub_within_the_recheck_window(session: Session) -> None:
    node = _node(session)
    job = job_row(session)
    cp = _checkpoint(session, job.id, 1, node)
    rid = _replica(session, cp, "a", "ssd", "verified", node)

    assert not find_copy(session, job.name, 1, "ssd", "a", HOUR).recently_read
    session.execute(
        update(Replica)
        .where(Replica.id == rid)
        .values(scrubbed_at=func.now() - text("interval '2 hours'"))
    )
    assert not find_copy(session, job.name, 1, "ssd", "a", HOUR).recently_read
    assert find_copy(session, job.name, 1, "ssd", "a", 3 * HOUR).recently_read


def test_no_shard_no_copy_or_no_checkpoint_is_not_found(session: Session) -> None:
    node = _node(session)
    job = job_row(session)
    cp = _checkpoint(session, job.id, 1, node)
    _replica(session, cp, "a", "ssd", "verified", node)

    with pytest.raises(CopyNotFound, match="no shard 'z'"):
        find_copy(session, job.name, 1, "ssd", "z", HOUR)
    with pytest.raises(CopyNotFound, match="no copy on tier 'lustre'"):
        find_copy(session, job.name, 1, "lustre", "a", HOUR)
    with pytest.raises(CheckpointNotFound):
        find_copy(session, job.name, 2, "ssd", "a", HOUR)


def test_a_bad_replicas_state_says_how_many_other_tiers_could_repair_it(session: Session) -> None:
    node = _node(session)
    job = job_row(session)
    cp = _checkpoint(session, job.id, 1, node)
    _replica(session, cp, "a", "ssd", "corrupt", node)
    _replica(session, cp, "a", "lustre", "verified", node)
    _replica(session, cp, "b", "lustre", "verified", node)  # another shard: no source for "a"
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
        .values(state="failed")
    )

    state = copy_state(session, find_copy(session, job.name, 1, "ssd", "a", HOUR), "ssd")
    assert (state.replica, state.tier_copy, state.sources) == ("corrupt", "failed", 1)
    # Seen from lustre, the ssd replica is corrupt: no source for a repair.
    lustre = copy_state(session, find_copy(session, job.name, 1, "lustre", "a", HOUR), "lustre")
    assert (lustre.replica, lustre.tier_copy, lustre.sources) == ("verified", "pending", 0)
