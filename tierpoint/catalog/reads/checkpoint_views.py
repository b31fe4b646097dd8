"""How a checkpoint is shown: the columns read, its tier copies with their progress, its parent and
verdict; a checkpoint just registered, without reading back what was just written. Every read of
one checkpoint or of a page of them (`checkpoints`, `latest`) builds its views here. Reads only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, String, and_, case, column, func, select, values
from sqlalchemy.orm import Session

from tierpoint.catalog.models import RESTORABLE, VERIFIED, Checkpoint, Job, Replica, Shard, TierCopy
from tierpoint.catalog.reads.views import (
    CheckpointRefView,
    CheckpointView,
    HealthView,
    ProgressView,
    TierView,
)
from tierpoint.catalog.stripe.coverage import CodedCoverage, summaries
from tierpoint.manifest import Manifest
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierConfig

CHECKPOINT_COLS = (
    Checkpoint.id,
    Checkpoint.step,
    Checkpoint.created_at,
    Checkpoint.meta,
    Checkpoint.pinned,
    Checkpoint.quarantine_reason,
    Checkpoint.total_bytes,
    Checkpoint.shard_count,
    Checkpoint.workflow_started_at,
    Checkpoint.deleted_at,
    Checkpoint.branch,
    Checkpoint.superseded_by,
    Checkpoint.parent_id,
    Checkpoint.provenance,
    Checkpoint.health,
    Checkpoint.health_evidence,
    Checkpoint.health_by,
    Checkpoint.health_at,
)


def health_view(r: Any) -> HealthView | None:
    """The verdict of a row with the `health*` columns, or None."""
    if r.health is None:
        return None
    e = r.health_evidence or {}
    value = e.get("value")
    return HealthView(
        r.health,
        e.get("metric"),
        None if value is None else float(value),
        e.get("at_step"),
        e.get("detail"),
        r.health_by,
        r.health_at,
    )


def checkpoint_refs(session: Session, ids: Sequence[int]) -> dict[int, CheckpointRefView]:
    """Each checkpoint of `ids` as a reference across jobs: id, job name, step, branch."""
    if not ids:
        return {}
    rows = session.execute(
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id.in_(sorted(set(ids))))
    )
    return {r[0]: CheckpointRefView(r[0], r[1], r[2], r[3]) for r in rows}


def tier_progress(
    session: Session, pairs: Sequence[tuple[int, str]]
) -> dict[tuple[int, str], tuple[int, int]]:
    """(checkpoint_id, tier) -> (shards verified, bytes done), read from replica rows through the
    (checkpoint_id, tier, state) index."""
    if not pairs:
        return {}
    done = case(
        (Replica.state == VERIFIED, Shard.size),
        (Replica.state == ReplicaState.COPYING.value, Replica.bytes_done),
        else_=0,
    )
    # Joined to a VALUES list rather than filtered by (checkpoint_id, tier) IN (...): the IN
    # becomes a bitmap OR of one branch per pair, planned as a parallel scan (a worker started
    # per request) at a few dozen pairs; the join probes the index once per pair.
    wanted = values(
        column("checkpoint_id", BigInteger), column("tier", String), name="wanted"
    ).data(list(pairs))
    rows = session.execute(
        select(
            Replica.checkpoint_id,
            Replica.tier,
            func.count().filter(Replica.state == VERIFIED),
            func.coalesce(func.sum(done), 0),
        )
        .select_from(wanted)
        .join(
            Replica,
            and_(Replica.checkpoint_id == wanted.c.checkpoint_id, Replica.tier == wanted.c.tier),
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .group_by(Replica.checkpoint_id, Replica.tier)
    )
    return {(r[0], r[1]): (int(r[2]), int(r[3])) for r in rows}


def _coded_coverage(
    session: Session, tier_copies: Sequence[Any], tiers: Sequence[TierConfig]
) -> dict[tuple[int, str], CodedCoverage]:
    """(checkpoint id, tier) -> the coverage of each coded copy not expired, one query per
    coded tier."""
    out: dict[tuple[int, str], CodedCoverage] = {}
    for t in tiers:
        code = t.stripe_code
        if code is None:
            continue
        gone = TierState.EXPIRED.value
        ids = [m.checkpoint_id for m in tier_copies if m.tier == t.name and m.state != gone]
        for cp, cover in summaries(session, t.name, code, ids).items():
            out[(cp, t.name)] = cover
    return out


def views(
    session: Session, job: str, rows: Sequence[Any], tiers: Sequence[TierConfig]
) -> list[CheckpointView]:
    if not rows:
        return []
    ids = [r.id for r in rows]
    tier_copies = (
        session.execute(
            select(
                TierCopy.checkpoint_id,
                TierCopy.tier,
                TierCopy.state,
                TierCopy.reason,
                TierCopy.quarantine_reason,
                TierCopy.restorable_at,
            ).where(TierCopy.checkpoint_id.in_(ids))
        )
    ).all()
    by_checkpoint: dict[int, list[Any]] = defaultdict(list)
    for m in tier_copies:
        by_checkpoint[m.checkpoint_id].append(m)
    # A restorable tier copy means every shard is verified there (invariant 1): no need to count. A
    # damaged replica demotes its tier copy in the same transaction (damage.py), so a restorable one
    # with a bad replica can only be a quarantined copy (a copy's finding quarantined it once):
    # those are counted, so a tier never reports shards verified that a read proved bad.
    counted = [m for m in tier_copies if m.state != RESTORABLE or m.quarantine_reason is not None]
    progress = tier_progress(session, [(m.checkpoint_id, m.tier) for m in counted])
    order = {t.name: i for i, t in enumerate(tiers)}
    kinds = {t.name: t.kind.value for t in tiers}
    coded = _coded_coverage(session, tier_copies, tiers)
    parents = checkpoint_refs(session, [r.parent_id for r in rows if r.parent_id is not None])
    views = []
    for r in rows:
        tier_views = []
        for m in sorted(by_checkpoint[r.id], key=lambda m: (order.get(m.tier, len(order)), m.tier)):
            cover = coded.get((r.id, m.tier))
            # guard: tier-view-counts-quarantined-copies
            if m.state == RESTORABLE and m.quarantine_reason is None:
                verified, done = r.shard_count, r.total_bytes
            elif cover is not None:
                # A coded copy has no replicas: a shard is there once its set is whole.
                verified, done = cover.whole, 0
            else:
                verified, done = progress.get((r.id, m.tier), (0, 0))
            tier_views.append(
                TierView(
                    tier=m.tier,
                    kind=kinds.get(m.tier),
                    state=m.state,
                    reason=m.reason,
                    quarantine_reason=m.quarantine_reason,
                    restorable_at=m.restorable_at,
                    progress=ProgressView(r.shard_count, verified, r.total_bytes, done),
                    coverage=cover,
                )
            )
        views.append(
            CheckpointView(
                id=r.id,
                job=job,
                step=r.step,
                created_at=r.created_at,
                metadata=r.meta,
                pinned=r.pinned,
                quarantine_reason=r.quarantine_reason,
                total_bytes=r.total_bytes,
                shard_count=r.shard_count,
                workflow_started=r.workflow_started_at is not None,
                tiers=tier_views,
                deleted_at=r.deleted_at,
                branch=r.branch,
                superseded_by=r.superseded_by,
                health=health_view(r),
                parent=parents.get(r.parent_id) if r.parent_id is not None else None,
                provenance=r.provenance,
            )
        )
    return views


def registered_view(
    job: str,
    checkpoint_id: int,
    created_at: datetime,
    manifest: Manifest,
    tiers: Sequence[TierConfig],
    *,
    branch: int = 1,
    parent: CheckpointRefView | None = None,
) -> CheckpointView:
    """The view of a checkpoint just registered, without reading back what was just written:
    every tier pending, nothing copied yet."""
    total = manifest.total_bytes
    n = len(manifest.shards)
    return CheckpointView(
        id=checkpoint_id,
        job=job,
        step=manifest.step,
        created_at=created_at,
        metadata=manifest.metadata,
        pinned=False,
        quarantine_reason=None,
        total_bytes=total,
        shard_count=n,
        workflow_started=False,
        tiers=[
            TierView(
                t.name,
                t.kind.value,
                TierState.PENDING.value,
                None,
                None,
                None,
                ProgressView(n, 0, total, 0),
            )
            for t in tiers
        ],
        branch=branch,
        parent=parent,
        provenance=(
            None
            if manifest.provenance is None
            else manifest.provenance.model_dump(exclude_none=True)
        ),
    )


def checkpoint_view(
    session: Session, job: str, checkpoint_id: int, tiers: Sequence[TierConfig]
) -> CheckpointView:
    rows = session.execute(select(*CHECKPOINT_COLS).where(Checkpoint.id == checkpoint_id)).all()
    return views(session, job, rows, tiers)[0]
