"""Why each checkpoint newer than the one "latest" chose was not chosen, on a real catalog: one
reason per tier (not copied, pending with its progress, failed with its reason, quarantined, a
node's local copy on other nodes), the checkpoint's own quarantine or health before any tier's,
and a bound on how many are explained."""

from __future__ import annotations

import uuid

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import job_row
from tierpoint.catalog.models import Checkpoint, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.latest import Timeline
from tierpoint.catalog.reads.skipped import skipped_above
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.states import ReplicaState
from tierpoint.tier_config import TierConfig, TierKind

SSD = TierConfig(name="ssd", kind=TierKind.LOCAL, root="/ssd")
LUSTRE = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")
TIERS = [SSD, LUSTRE]


def _step(session: Session, job_id: int, step: int, node: str, shards: int = 2) -> int:
    upsert_node(session, node, {})
    cp: int | None = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=step, total_bytes=10, shard_count=shards, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    assert cp is not None
    for i in range(shards):
        shard = session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=i, path=f"s{i}", size=5, node_id=node)
            .returning(Shard.id)
        )
        assert shard is not None
        if i == 0:
            write = ReplicaWrite(shard, ReplicaState.VERIFIED, f"/ssd/{i}", node, 5)
            upsert_replicas(session, cp, "ssd", [write])
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="ssd", job_id=job_id, step=step))
    return cp


def test_each_newer_step_says_why_per_tier(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    job = job_row(session)
    _step(session, job.id, 2, node)  # ssd pending: 1 of 2 verified
    failed = _step(session, job.id, 3, node)
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == failed)
        .values(state="failed", reason="disk full")
    )
    elsewhere = _step(session, job.id, 4, f"{node}-b")
    session.execute(
        update(TierCopy).where(TierCopy.checkpoint_id == elsewhere).values(state="restorable")
    )
    quarantined = _step(session, job.id, 5, node)
    session.execute(
        update(Checkpoint).where(Checkpoint.id == quarantined).values(quarantine_reason="NaN")
    )

    skipped = skipped_above(session, job.id, 1, TIERS, TIERS, node, 10, Timeline())
    assert [(s.step, s.reasons) for s in skipped] == [
        (5, ["quarantined: NaN"]),
        (4, [f"ssd: only on nodes {node}-b (caller {node})", "lustre: not copied to this tier"]),
        (3, ["ssd: failed: disk full", "lustre: not copied to this tier"]),
        (2, ["ssd: copying, 1/2 shards verified", "lustre: not copied to this tier"]),
    ]
    # With no node, a node's local copy is offered to nobody, and says how to get it.
    anyone = skipped_above(session, job.id, 3, TIERS, TIERS, None, 10, Timeline())
    assert anyone[1].reasons[0] == "ssd: node-local copy; pass node= to restore from it"
    # Asked for good checkpoints only: the health is the reason, whatever the copies.
    good_only = skipped_above(session, job.id, 3, TIERS, TIERS, node, 10, Timeline(good=True))
    assert [(s.step, s.reasons) for s in good_only] == [
        (5, ["quarantined: NaN"]),
        (4, ["health: no verdict"]),
    ]


def test_only_the_newest_are_explained_and_the_cut_is_said(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    job = job_row(session)
    for step in range(2, 6):
        _step(session, job.id, step, node)
    skipped = skipped_above(session, job.id, None, TIERS, [SSD], node, 2, Timeline())
    assert [s.step for s in skipped] == [5, 4, 3]
    assert skipped[-1].reasons[0].startswith("not examined: only the 2 newest checkpoints")
    assert skipped_above(session, job.id, 5, TIERS, TIERS, node, 10, Timeline()) == []
