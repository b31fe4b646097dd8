"""Reads behind the operator views: copies in flight with their progress, promotion lag, tier
usage, nodes, a checkpoint's events (the jobs overview is in overview.py, the failures in
tier_copy/failures.py). Reads only.

Every query is bounded by a page or by an index on the rows it is about (pending and failed
tier copies are few however large the catalog grows: partial indexes hold just them), so the views
stay fast on a catalog of millions of shards. Progress comes from what the copy activities
record in the catalog (`replica.bytes_done`), never from asking Temporal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.models import (
    Checkpoint,
    Event,
    Job,
    Node,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.reads.checkpoint_views import tier_progress
from tierpoint.catalog.reads.operator_views import (
    EventView,
    InFlightView,
    LagView,
    NodeView,
    TierUsageRowView,
)
from tierpoint.catalog.tier_copy.failures import last_errors
from tierpoint.states import ReplicaState, TierState

PENDING = TierState.PENDING.value
FAILED = TierState.FAILED.value
# Copies that hold the job's bytes on a tier: restorable, or restorable until retention finishes.
HELD = (TierState.RESTORABLE.value, TierState.EXPIRING.value)


# ---------------------------------------------------------------------------------------------
# Copies in flight


def in_flight(
    session: Session,
    tiers: Sequence[str],
    *,
    job: str | None = None,
    tier: str | None = None,
    limit: int = 100,
) -> tuple[list[InFlightView], datetime]:
    """Pending tier copies, oldest checkpoint first, with bytes done, throughput and ETA."""
    now = catalog_now(session)
    ct = TierCopy
    q = (
        select(
            ct.checkpoint_id,
            ct.tier,
            Job.name,
            Checkpoint.step,
            Checkpoint.created_at,
            Checkpoint.total_bytes,
            Checkpoint.shard_count,
        )
        .join(Checkpoint, Checkpoint.id == ct.checkpoint_id)
        .join(Job, Job.id == ct.job_id)
        .where(ct.state == PENDING)
        .order_by(Checkpoint.created_at, ct.checkpoint_id, ct.tier)
        .limit(limit)
    )
    if job is not None:
        q = q.where(Job.name == job)
    if tier is not None:
        q = q.where(ct.tier == tier)
    rows = session.execute(q).all()
    if not rows:
        return [], now
    ids = sorted({r.checkpoint_id for r in rows})
    promoted: dict[int, dict[str, datetime]] = defaultdict(dict)
    for m in session.execute(
        select(ct.checkpoint_id, ct.tier, ct.restorable_at).where(
            ct.checkpoint_id.in_(ids), ct.restorable_at.is_not(None)
        )
    ):
        promoted[m.checkpoint_id][m.tier] = m.restorable_at
    progress = tier_progress(session, [(r.checkpoint_id, r.tier) for r in rows])
    errors = last_errors(session, [(r.checkpoint_id, r.tier) for r in rows])
    order = {name: i for i, name in enumerate(tiers)}
    views = []
    for r in rows:
        faster = [
            at
            for name, at in promoted[r.checkpoint_id].items()
            if order.get(name, len(order)) < order.get(r.tier, len(order))
        ]
        started = max(faster) if faster else r.created_at
        verified, done = progress.get((r.checkpoint_id, r.tier), (0, 0))
        elapsed = max((now - started).total_seconds(), 0.0)
        rate = done / elapsed if done and elapsed > 0 else None
        eta = (r.total_bytes - done) / rate if rate else None
        views.append(
            InFlightView(
                job=r.name,
                step=r.step,
                checkpoint_id=r.checkpoint_id,
                tier=r.tier,
                created_at=r.created_at,
                started_at=started,
                shards_total=r.shard_count,
                shards_verified=verified,
                bytes_total=r.total_bytes,
                bytes_done=done,
                elapsed_seconds=elapsed,
                bytes_per_second=rate,
                eta_seconds=eta,
                last_error=errors.get((r.checkpoint_id, r.tier)),
            )
        )
    return views, now


def count_in_flight(session: Session, *, job: str | None = None, tier: str | None = None) -> int:
    """How many tier copies are pending (with the same filters as `in_flight`), listed or not."""
    ct = TierCopy
    q = select(func.count()).select_from(ct).where(ct.state == PENDING)
    if job is not None:
        q = q.join(Job, Job.id == ct.job_id).where(Job.name == job)
    if tier is not None:
        q = q.where(ct.tier == tier)
    return int(session.scalar(q) or 0)


# ---------------------------------------------------------------------------------------------
# Lag, usage, nodes, events


def promotion_lag(
    session: Session, window: timedelta, *, job: str | None = None
) -> tuple[list[LagView], datetime]:
    """Registration -> restorable per job and tier, over the copies promoted within `window`."""
    now = catalog_now(session)
    ct = TierCopy
    lag = func.extract("epoch", ct.restorable_at - Checkpoint.created_at)
    q = (
        select(
            Job.name,
            ct.tier,
            func.count(),
            func.percentile_cont(0.5).within_group(lag),
            func.percentile_cont(0.95).within_group(lag),
            func.max(lag),
        )
        .join(Checkpoint, Checkpoint.id == ct.checkpoint_id)
        .join(Job, Job.id == ct.job_id)
        .where(ct.restorable_at.is_not(None), ct.restorable_at >= now - window)
        .group_by(Job.name, ct.tier)
        .order_by(Job.name, ct.tier)
    )
    if job is not None:
        q = q.where(Job.name == job)
    views = [
        LagView(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), float(r[5]))
        for r in session.execute(q)
    ]
    return views, now


def tier_usage(session: Session) -> list[TierUsageRowView]:
    """Bytes and checkpoints of every job on every tier (restorable or expiring copies)."""
    ct = TierCopy
    rows = session.execute(
        select(ct.tier, Job.name, func.sum(Checkpoint.total_bytes), func.count())
        .join(Checkpoint, Checkpoint.id == ct.checkpoint_id)
        .join(Job, Job.id == ct.job_id)
        .where(ct.state.in_(HELD))
        .group_by(ct.tier, Job.name)
        .order_by(ct.tier, func.sum(Checkpoint.total_bytes).desc(), Job.name)
    )
    return [TierUsageRowView(r[0], r[1], int(r[2]), int(r[3])) for r in rows]


def nodes(session: Session) -> list[NodeView]:
    held = (
        select(
            Replica.node_id,
            func.coalesce(func.sum(Shard.size), 0).label("bytes"),
            func.count().label("n"),
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .where(Replica.node_id.is_not(None), Replica.state == ReplicaState.VERIFIED.value)
        .group_by(Replica.node_id)
        .subquery()
    )
    rows = session.execute(
        select(
            Node.id, Node.last_seen_at, Node.lost_at, held.c.bytes, held.c.n, Node.failure_domain
        )
        .outerjoin(held, held.c.node_id == Node.id)
        .order_by(Node.id)
    )
    return [
        NodeView(
            r.id, r.last_seen_at, r.lost_at, int(r.bytes or 0), int(r.n or 0), r.failure_domain
        )
        for r in rows
    ]


def checkpoint_events(
    session: Session,
    job: str,
    step: int,
    *,
    limit: int = 200,
    after_id: int | None = None,
    branch: int | None = None,
) -> tuple[list[EventView], int | None]:
    """A checkpoint's history (the one at `step`, on `branch` when given), oldest first (keyset
    on the event id)."""
    checkpoint_id = (find_checkpoint(session, job, step, branch=branch)).id
    q = (
        select(Event.id, Event.kind, Event.tier, Event.actor, Event.detail, Event.created_at)
        .where(Event.checkpoint_id == checkpoint_id)
        .order_by(Event.id)
        .limit(limit + 1)
    )
    if after_id is not None:
        q = q.where(Event.id > after_id)
    rows = session.execute(q).all()
    views = [EventView(r.id, r.kind, r.tier, r.actor, r.detail, r.created_at) for r in rows[:limit]]
    return views, (rows[limit - 1].id if len(rows) > limit else None)
