"""What reconciliation expects a tier to hold for one job, read off a real catalog: on a local
tier the node's own shards and the files a reader keeps there, on a shared tier every shard, on
a peer tier the copies the holder holds; each with its replica on that tier, if any."""

from __future__ import annotations

import uuid

from sqlalchemy import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.models import CachedCopy, Checkpoint, Job, Replica, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.reconcile import Expected, job_on_tier


def _name() -> str:
    return uuid.uuid4().hex[:8]


def test_each_tier_expects_the_shards_it_should_hold_with_their_replicas(session: Session) -> None:
    a, b, holder = (f"node-{_name()}" for _ in range(3))
    for node in (a, b, holder):
        upsert_node(session, node, {})
    job = f"job-{_name()}"
    job_id = session.scalar(insert(Job).values(name=job).returning(Job.id))
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=7, total_bytes=6, shard_count=3, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    a0, a1, b0 = (
        session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=i, path=path, size=size, node_id=node)
            .returning(Shard.id)
        )
        for i, (path, size, node) in enumerate([("a0", 1, a), ("a1", 2, a), ("b0", 3, b)])
    )
    assert a0 is not None and a1 is not None and b0 is not None

    def replica(shard: int, tier: str, node: str | None, state: str) -> int:
        rid: int | None = session.scalar(
            insert(Replica)
            .values(
                shard_id=shard, checkpoint_id=cp, tier=tier, node_id=node, state=state, location="x"
            )
            .returning(Replica.id)
        )
        assert rid is not None
        return rid

    sealed = replica(a0, "ssd", a, "verified")
    shared = replica(b0, "lustre", None, "copying")
    held = replica(b0, "peer", holder, "verified")
    replica(a1, "peer", b, "verified")  # held by another node
    # Node a loaded b's shard and keeps it on its local tier.
    session.execute(insert(CachedCopy).values(shard_id=b0, tier="ssd", node_id=a, checkpoint_id=cp))

    assert job_on_tier(session, job, "ssd", a) == {
        ("7", "a0"): Expected(1, sealed, "verified"),
        ("7", "a1"): Expected(2, None, None),  # not sealed yet: known all the same
        ("7", "b0"): Expected(3, None, None),  # the reader's copy, never a replica
    }
    assert job_on_tier(session, job, "ssd", b) == {("7", "b0"): Expected(3, None, None)}
    assert job_on_tier(session, job, "lustre", None) == {
        ("7", "a0"): Expected(1, None, None),
        ("7", "a1"): Expected(2, None, None),
        ("7", "b0"): Expected(3, shared, "copying"),
    }
    assert job_on_tier(session, job, "peer", None, holder=holder) == {
        ("7", "b0"): Expected(3, held, "verified")
    }
    assert job_on_tier(session, f"job-{_name()}", "lustre", None) == {}
