"""The operator views' reads on a real catalog: copies in flight (oldest first, their progress
measured from the previous tier's promotion), promotion lag over a window, tier usage, nodes with
their verified local replicas, and a checkpoint's events paged by id."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.checkpoint.supersede import supersede
from tierpoint.catalog.models import Checkpoint, Event, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.operator import (
    checkpoint_events,
    count_in_flight,
    in_flight,
    nodes,
    promotion_lag,
    tier_usage,
)
from tierpoint.errors.checkpoints import CheckpointNotFound

TIERS = ("ssd", "lustre")


def _ago(seconds: int) -> object:
    return func.now() - text(f"interval '{seconds} seconds'")


def _checkpoint(session: Session, job_id: int, step: int, *, age: int, size: int = 100) -> int:
    """A checkpoint registered `age` seconds before the transaction, pending on both tiers."""
    cp = checkpoint_row(session, job_id, step, tiers=TIERS)
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == cp)
        .values(created_at=_ago(age), total_bytes=size, shard_count=1)
    )
    return cp


def _tier_copy(session: Session, cp: int, tier: str, **values: object) -> None:
    session.execute(
        update(TierCopy).where(TierCopy.checkpoint_id == cp, TierCopy.tier == tier).values(**values)
    )


def _shard(session: Session, cp: int, node: str, size: int = 100) -> int:
    sid: int | None = session.scalar(
        insert(Shard)
        .values(checkpoint_id=cp, ordinal=0, path="a", size=size, node_id=node)
        .returning(Shard.id)
    )
    assert sid is not None
    return sid


def _replica(
    session: Session, cp: int, sid: int, tier: str, state: str, *, done: int, node: str | None
) -> None:
    session.execute(
        insert(Replica).values(
            shard_id=sid,
            checkpoint_id=cp,
            tier=tier,
            node_id=node,
            state=state,
            location=f"/{tier}/a",
            bytes_done=done,
        )
    )


def test_copies_in_flight_are_oldest_first_with_progress_from_the_previous_tiers_promotion(
    session: Session,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    job = job_row(session)
    old = _checkpoint(session, job.id, 1, age=300)
    # ssd was done 200 s ago: the lustre copy could only start then.
    _tier_copy(session, old, "ssd", state="restorable", restorable_at=_ago(200))
    sid = _shard(session, old, node)
    _replica(session, old, sid, "lustre", "copying", done=40, node=None)
    new = _checkpoint(session, job.id, 2, age=100)

    views, _ = in_flight(session, TIERS, job=job.name)
    # Oldest checkpoint first, then by tier name: a stable order for an operator's paging.
    assert [(v.step, v.tier) for v in views] == [(1, "lustre"), (2, "lustre"), (2, "ssd")]
    lustre = views[0]
    assert (lustre.elapsed_seconds, lustre.bytes_done, lustre.shards_verified) == (200.0, 40, 0)
    assert (lustre.bytes_per_second, lustre.eta_seconds) == (0.2, 300.0)
    # Nothing copied yet: no rate, no ETA (never a division by zero or a guess).
    fresh = views[1]
    assert (fresh.checkpoint_id, fresh.elapsed_seconds) == (new, 100.0)
    assert (fresh.bytes_per_second, fresh.eta_seconds) == (None, None)
    assert [v.step for v in in_flight(session, TIERS, job=job.name, tier="ssd")[0]] == [2]
    assert len(in_flight(session, TIERS, job=job.name, limit=2)[0]) == 2
    assert count_in_flight(session, job=job.name) == 3
    assert count_in_flight(session, job=job.name, tier="lustre") == 2


def test_promotion_lag_is_over_the_copies_promoted_within_the_window(session: Session) -> None:
    job = job_row(session)
    for step, lag in enumerate((10, 20, 30), start=1):
        cp = _checkpoint(session, job.id, step, age=100)
        _tier_copy(session, cp, "ssd", state="restorable", restorable_at=_ago(100 - lag))
    stale = _checkpoint(session, job.id, 9, age=10_000)
    _tier_copy(session, stale, "ssd", state="restorable", restorable_at=_ago(9_000))

    views, _ = promotion_lag(session, timedelta(hours=1), job=job.name)
    assert [(v.tier, v.count, v.p50_seconds, v.max_seconds) for v in views] == [
        ("ssd", 3, 20.0, 30.0)
    ]
    assert views[0].p95_seconds == pytest.approx(29.0)
    assert promotion_lag(session, timedelta(hours=3), job=job.name)[0][0].count == 4


def test_tier_usage_sums_the_held_copies_per_job_and_tier(session: Session) -> None:
    job = job_row(session)
    held = _checkpoint(session, job.id, 1, age=0, size=100)
    _tier_copy(session, held, "ssd", state="restorable")
    expiring = _checkpoint(session, job.id, 2, age=0, size=50)
    _tier_copy(session, expiring, "ssd", state="expiring")
    _checkpoint(session, job.id, 3, age=0, size=1_000)  # pending: holds nothing yet

    mine = [(r.tier, r.bytes, r.checkpoints) for r in tier_usage(session) if r.job == job.name]
    assert mine == [("ssd", 150, 2)]


def test_a_node_counts_only_its_verified_local_replicas(session: Session) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    idle = f"{node}-idle"
    upsert_node(session, idle, {})
    job = job_row(session)
    for step, state in ((1, "verified"), (2, "verified"), (3, "corrupt")):
        cp = _checkpoint(session, job.id, step, age=0)
        _replica(
            session, cp, _shard(session, cp, node, size=10 * step), "ssd", state, done=0, node=node
        )

    by_id = {n.id: n for n in nodes(session)}
    assert (by_id[node].local_bytes, by_id[node].local_replicas) == (30, 2)
    assert (by_id[idle].local_bytes, by_id[idle].local_replicas) == (0, 0)


def test_a_checkpoints_events_are_paged_oldest_first_on_its_branch(session: Session) -> None:
    job = job_row(session)
    old = checkpoint_row(session, job.id, 5)
    supersede(session, job.id, [old], 4, 2, actor="ops")  # one event: superseded
    new = checkpoint_row(session, job.id, 5, branch=2)
    session.execute(
        insert(Event),
        [{"kind": "promoted", "checkpoint_id": new, "job_id": job.id, "tier": t} for t in TIERS],
    )
    session.execute(insert(Event).values(kind="deleted", checkpoint_id=new, job_id=job.id))

    first, cursor = checkpoint_events(session, job.name, 5, limit=2)
    assert [(e.kind, e.tier) for e in first] == [("promoted", "ssd"), ("promoted", "lustre")]
    assert cursor == first[-1].id
    rest, cursor = checkpoint_events(session, job.name, 5, limit=2, after_id=cursor)
    assert ([e.kind for e in rest], cursor) == (["deleted"], None)
    on_one, _ = checkpoint_events(session, job.name, 5, branch=1)
    assert [(e.kind, e.actor) for e in on_one] == [("superseded", "ops")]
    with pytest.raises(CheckpointNotFound):
        checkpoint_events(session, job.name, 6)
    assert session.scalar(select(func.count()).where(Event.checkpoint_id == old)) == 1
