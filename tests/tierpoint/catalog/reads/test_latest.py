"""Latest restorable on a real catalog: the newest step restorable from a tier the caller may
read, each newer step skipped with its reason, a node's local copies offered only to that node,
a quarantined checkpoint never offered, and a job with nothing restorable refused."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.errors import NoRestorableCheckpoint
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierConfig, TierKind

TIERS = [
    TierConfig(name="ssd", kind=TierKind.LOCAL, root="/ssd"),
    TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre"),
]


def _step(session: Session, job_id: int, step: int, node: str, *, sealed: bool) -> int:
    """A one-shard checkpoint at `step` on `node` with a local copy: sealed (verified and
    promoted restorable) or still pending."""
    cp: int | None = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=step, total_bytes=10, shard_count=1, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    shard = session.scalar(
        insert(Shard)
        .values(checkpoint_id=cp, ordinal=0, path="a", size=10, checksum="0badf00d", node_id=node)
        .returning(Shard.id)
    )
    assert cp is not None and shard is not None
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="ssd", job_id=job_id, step=step))
    if sealed:
        verified = ReplicaWrite(shard, ReplicaState.VERIFIED, f"/ssd/{node}/a", node, bytes_done=10)
        upsert_replicas(session, cp, "ssd", [verified])
        assert promote(session, cp, "ssd", [], None).state == TierState.RESTORABLE.value
    return cp


def test_the_newest_restorable_step_with_the_reasons_for_newer_ones(session: Session) -> None:
    node, other = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for n in (node, other):
        upsert_node(session, n, {})
    job = f"job-{uuid.uuid4().hex[:10]}"
    job_id = session.scalar(insert(Job).values(name=job).returning(Job.id))
    assert job_id is not None
    first = _step(session, job_id, 1, node, sealed=True)
    _step(session, job_id, 2, node, sealed=False)

    latest = latest_restorable(session, job, TIERS, node=node)
    assert latest.step == 1
    assert [(e.path, e.tier, e.node) for e in latest.plan] == [("a", "ssd", node)]
    assert [s.step for s in latest.skipped] == [2] and latest.skipped[0].reasons
    # Another node cannot read this node's local copy: nothing is restorable for it.
    with pytest.raises(NoRestorableCheckpoint):
        latest_restorable(session, job, TIERS, node=other)
    with pytest.raises(NoRestorableCheckpoint):
        latest_restorable(session, job, TIERS, node=None)
    # A quarantined checkpoint is never offered, whichever tier holds it.
    session.execute(
        update(Checkpoint).where(Checkpoint.id == first).values(quarantine_reason="NaN")
    )
    with pytest.raises(NoRestorableCheckpoint):
        latest_restorable(session, job, TIERS, node=node)
    with pytest.raises(NoRestorableCheckpoint, match="has no checkpoints"):
        latest_restorable(session, f"job-{uuid.uuid4().hex[:10]}", TIERS, node=node)
