"""How a checkpoint is shown, on a real catalog: each tier copy's progress (a restorable copy whole
without counting, any other copy from its replicas, a quarantined copy counted so a shard a read
proved bad is never reported verified), tiers in the configured order, the parent as a reference
across jobs, the health verdict, and the view of a checkpoint just registered."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.models import Checkpoint, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.checkpoint_views import (
    checkpoint_refs,
    checkpoint_view,
    registered_view,
    tier_progress,
)
from tierpoint.catalog.reads.views import CheckpointRefView, HealthView, ProgressView
from tierpoint.manifest import Manifest
from tierpoint.tier_config import TierConfig, TierKind

SSD = TierConfig(name="ssd", kind=TierKind.LOCAL, root="/ssd")
LUSTRE = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")
TIERS = [SSD, LUSTRE]
SIZES = (10, 20, 30)


def _three_shards(session: Session, job_id: int, step: int, tiers: tuple[str, ...]) -> int:
    """A checkpoint of three shards (10, 20 and 30 bytes) with a pending copy on each tier."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    cp = checkpoint_row(session, job_id, step, tiers=tiers)
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == cp)
        .values(shard_count=len(SIZES), total_bytes=sum(SIZES))
    )
    for i, size in enumerate(SIZES):
        session.execute(
            insert(Shard).values(checkpoint_id=cp, ordinal=i, path=f"s{i}", size=size, node_id=node)
        )
    return cp


def _replicas(session: Session, cp: int, tier: str, states: list[tuple[str, int]]) -> None:
    """One replica on `tier` per shard, by ordinal: (state, bytes done)."""
    shards = session.scalars(
        select(Shard.id).where(Shard.checkpoint_id == cp).order_by(Shard.ordinal)
    ).all()
    session.execute(
        insert(Replica),
        [
            {
                "shard_id": sid,
                "checkpoint_id": cp,
                "tier": tier,
                "state": state,
                "location": f"/{tier}/{sid}",
                "bytes_done": done,
            }
            for sid, (state, done) in zip(shards, states, strict=True)
        ],
    )


def _tier_copy(session: Session, cp: int, tier: str, **values: object) -> None:
    session.execute(
        update(TierCopy).where(TierCopy.checkpoint_id == cp, TierCopy.tier == tier).values(**values)
    )


def test_a_pending_copy_counts_verified_shards_and_the_bytes_copied_so_far(
    session: Session,
) -> None:
    job = job_row(session)
    cp = _three_shards(session, job.id, 1, ("ssd",))
    _replicas(session, cp, "ssd", [("verified", 10), ("copying", 7), ("corrupt", 30)])

    view = checkpoint_view(session, job.name, cp, TIERS)
    # A verified shard counts whole, a copying one by its bytes, a corrupt one not at all.
    assert view.tiers[0].progress == ProgressView(3, 1, 60, 17)
    assert tier_progress(session, [(cp, "ssd"), (cp, "lustre")]) == {(cp, "ssd"): (1, 17)}
    assert tier_progress(session, []) == {}


def test_a_restorable_copy_is_whole_but_a_quarantined_one_counts_its_replicas(
    session: Session,
) -> None:
    job = job_row(session)
    cp = _three_shards(session, job.id, 1, ("ssd", "lustre"))
    _tier_copy(session, cp, "ssd", state="restorable")
    # A read proved one lustre shard corrupt: the copy was quarantined, still restorable.
    _replicas(session, cp, "lustre", [("verified", 10), ("corrupt", 20), ("verified", 30)])
    _tier_copy(session, cp, "lustre", state="restorable", quarantine_reason="crc mismatch")

    by_tier = {t.tier: t for t in checkpoint_view(session, job.name, cp, TIERS).tiers}
    # Invariant 1: restorable means every shard verified; nothing to count (no replica rows here).
    assert by_tier["ssd"].progress == ProgressView(3, 3, 60, 60)
    assert by_tier["lustre"].progress == ProgressView(3, 2, 60, 40)
    assert by_tier["lustre"].quarantine_reason == "crc mismatch"


def test_tiers_come_in_the_configured_order_and_an_unconfigured_one_last(
    session: Session,
) -> None:
    job = job_row(session)
    cp = checkpoint_row(session, job.id, 1, tiers=("archive", "lustre", "ssd"))
    _tier_copy(session, cp, "lustre", state="failed", reason="quota")

    tiers = checkpoint_view(session, job.name, cp, TIERS).tiers
    assert [(t.tier, t.kind, t.state, t.reason) for t in tiers] == [
        ("ssd", "local", "pending", None),
        ("lustre", "shared", "failed", "quota"),
        ("archive", None, "pending", None),
    ]


def test_the_parent_is_a_reference_across_jobs_and_the_verdict_is_read_from_its_evidence(
    session: Session,
) -> None:
    parent_job = job_row(session)
    parent = checkpoint_row(session, parent_job.id, 40, branch=2)
    job = job_row(session)
    cp = checkpoint_row(session, job.id, 1)
    at = datetime(2026, 1, 2, tzinfo=UTC)
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == cp)
        .values(
            parent_id=parent,
            health="suspect",
            health_evidence={"metric": "loss", "value": "2.5", "at_step": 3, "detail": "spike"},
            health_by="evaluator",
            health_at=at,
        )
    )

    view = checkpoint_view(session, job.name, cp, TIERS)
    assert view.parent == CheckpointRefView(parent, parent_job.name, 40, 2)
    assert view.health == HealthView("suspect", "loss", 2.5, 3, "spike", "evaluator", at)
    assert checkpoint_view(session, parent_job.name, parent, TIERS).health is None
    # References are read once per checkpoint, whatever the repeats; none asked, none read.
    assert checkpoint_refs(session, [parent, parent]) == {
        parent: CheckpointRefView(parent, parent_job.name, 40, 2)
    }
    assert checkpoint_refs(session, []) == {}


def test_a_checkpoint_just_registered_is_pending_on_every_tier_with_nothing_copied() -> None:
    manifest = Manifest.model_validate(
        {
            "step": 9,
            "shards": [
                {"path": "a", "size": 4, "crc32c": "00000001", "node": "n"},
                {"path": "b", "size": 6, "crc32c": "00000002", "node": "n"},
            ],
            "metadata": {"loss": 1.0},
        }
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)
    view = registered_view("job", 5, now, manifest, TIERS, branch=3)
    assert (view.id, view.step, view.branch, view.total_bytes, view.shard_count) == (5, 9, 3, 10, 2)
    assert view.metadata == {"loss": 1.0} and view.provenance is None
    assert [(t.tier, t.kind, t.state, t.progress) for t in view.tiers] == [
        ("ssd", "local", "pending", ProgressView(2, 0, 10, 0)),
        ("lustre", "shared", "pending", ProgressView(2, 0, 10, 0)),
    ]
