"""Reads behind the checkpoint and job endpoints: one checkpoint (with its tiers, shards and
replicas), a page of a job's checkpoints, the jobs. Reads only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, String, and_, case, column, exists, func, select, values
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import (
    job_id_by_name,
    no_checkpoint,
    no_job,
    require_job_id,
)
from tierpoint.catalog.locks import at_step
from tierpoint.catalog.models import (
    RESTORABLE,
    VERIFIED,
    Checkpoint,
    Job,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads.views import (
    CheckpointDetailView,
    CheckpointRefView,
    CheckpointView,
    HealthView,
    JobView,
    ProgressView,
    ReplicaView,
    ShardView,
    TierView,
)
from tierpoint.catalog.tier_copy import key_layouts
from tierpoint.manifest import Manifest
from tierpoint.states import ReplicaState, TierState
from tierpoint.storage.s3.layout import s3_object
from tierpoint.tier_config import TierConfig, TierKind

# ---------------------------------------------------------------------------------------------
# Building checkpoint views


_CHECKPOINT_COLS = (
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


def _views(
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
    parents = checkpoint_refs(session, [r.parent_id for r in rows if r.parent_id is not None])
    views = []
    for r in rows:
        tier_views = []
        for m in sorted(by_checkpoint[r.id], key=lambda m: (order.get(m.tier, len(order)), m.tier)):
            # guard: tier-view-counts-quarantined-copies
            if m.state == RESTORABLE and m.quarantine_reason is None:
                verified, done = r.shard_count, r.total_bytes
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
    rows = session.execute(select(*_CHECKPOINT_COLS).where(Checkpoint.id == checkpoint_id)).all()
    return _views(session, job, rows, tiers)[0]


def get_checkpoint(
    session: Session,
    job: str,
    step: int,
    tiers: Sequence[TierConfig],
    *,
    include_shards: bool = True,
    branch: int | None = None,
) -> CheckpointDetailView:
    rows = (
        session.execute(
            select(*_CHECKPOINT_COLS)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, at_step(step, branch))
        )
    ).all()
    if not rows:
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    view = _views(session, job, rows, tiers)[0]
    detail = CheckpointDetailView(**{f: getattr(view, f) for f in view.__dataclass_fields__})
    if not include_shards:
        return detail
    shards = (
        session.execute(
            select(Shard.id, Shard.path, Shard.size, Shard.checksum, Shard.node_id)
            .where(Shard.checkpoint_id == view.id)
            .order_by(Shard.ordinal)
        )
    ).all()
    replicas: dict[int, list[ReplicaView]] = defaultdict(list)
    order = {t.name: i for i, t in enumerate(tiers)}
    by_name = {t.name: t for t in tiers}
    paths = {sh.id: sh.path for sh in shards}
    rows = (
        session.execute(
            select(
                Replica.shard_id,
                Replica.tier,
                Replica.node_id,
                Replica.state,
                Replica.location,
                Replica.bytes_done,
                Replica.verified_at,
                Replica.error,
                Replica.scrubbed_at,
            ).where(Replica.checkpoint_id == view.id)
        )
    ).all()
    peers = {t.name for t in tiers if t.kind is TierKind.PEER}
    urls = registry.data_urls(session, {r.node_id for r in rows if r.tier in peers})
    layouts = key_layouts.of_checkpoint(session, view.id)
    for r in rows:
        # No tier copy, no layout to name the object by: no (bucket, key) rather than a guess.
        layout = layouts.get(r.tier)
        bucket, key = (
            (None, None)
            if layout is None
            else s3_object(by_name.get(r.tier), layout, job, step, paths[r.shard_id], view.branch)
        )
        replicas[r.shard_id].append(
            ReplicaView(
                r.tier,
                r.node_id,
                r.state,
                r.location,
                r.bytes_done,
                r.verified_at,
                r.error,
                r.scrubbed_at,
                bucket,
                key,
                registry.peer_url(
                    by_name.get(r.tier), urls, r.node_id, job, step, paths[r.shard_id], view.branch
                ),
            )
        )
    detail.shards = [
        ShardView(
            path=s.path,
            size=s.size,
            crc32c=s.checksum,
            node=s.node_id,
            replicas=sorted(replicas[s.id], key=lambda x: (order.get(x.tier, len(order)), x.tier)),
        )
        for s in shards
    ]
    return detail


def list_checkpoints(
    session: Session,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    state: str | None = None,
    limit: int = 50,
    before_step: int | None = None,
) -> tuple[list[CheckpointView], int | None]:
    """A page of the job's checkpoints by step, newest first, and the step to continue below
    (keyset pagination), or None on the last page."""
    job_id = job_id_by_name(session, job)
    if job_id is None:
        raise no_job(job)
    if tier is not None and state is not None:
        # Driven by the tier copies index (job_id, state, tier, step DESC).
        q = (
            select(*_CHECKPOINT_COLS)
            .select_from(TierCopy)
            .join(Checkpoint, Checkpoint.id == TierCopy.checkpoint_id)
            .where(
                TierCopy.job_id == job_id,
                TierCopy.state == state,
                TierCopy.tier == tier,
            )
            .order_by(TierCopy.step.desc(), Checkpoint.branch.desc())
        )
        if before_step is not None:
            q = q.where(TierCopy.step < before_step)
    else:
        q = select(*_CHECKPOINT_COLS).where(Checkpoint.job_id == job_id)
        if tier is not None or state is not None:
            cond = [TierCopy.checkpoint_id == Checkpoint.id]
            if tier is not None:
                cond.append(TierCopy.tier == tier)
            if state is not None:
                cond.append(TierCopy.state == state)
            q = q.where(exists().where(and_(*cond)))
        if before_step is not None:
            q = q.where(Checkpoint.step < before_step)
        q = q.order_by(Checkpoint.step.desc(), Checkpoint.branch.desc())
    rows = session.execute(q.limit(limit + 1)).all()
    if len(rows) <= limit:
        return _views(session, job, rows, tiers), None
    page = rows[:limit]
    if rows[limit].step == page[-1].step:
        # The cursor is a step: a page ends where a step ends, so a step saved on several
        # branches is never split between two pages (unless one step fills a whole page).
        whole = [r for r in page if r.step != page[-1].step]
        page = whole or page
    return _views(session, job, page, tiers), page[-1].step


def list_jobs(
    session: Session, *, limit: int = 100, after_name: str | None = None
) -> tuple[list[JobView], str | None]:
    count = select(func.count()).where(Checkpoint.job_id == Job.id).correlate(Job).scalar_subquery()
    # The newest step of the job's timeline: a rollback's superseded steps are not its progress.
    latest = (
        select(func.max(Checkpoint.step))
        .where(Checkpoint.job_id == Job.id, Checkpoint.superseded_by.is_(None))
        .correlate(Job)
        .scalar_subquery()
    )
    q = select(Job.name, Job.created_at, count.label("n"), latest.label("latest")).order_by(
        Job.name
    )
    if after_name is not None:
        q = q.where(Job.name > after_name)
    rows = session.execute(q.limit(limit + 1)).all()
    jobs = [JobView(r.name, r.created_at, r.n, r.latest) for r in rows[:limit]]
    return jobs, (rows[limit - 1].name if len(rows) > limit else None)


# ---------------------------------------------------------------------------------------------
# Latest restorable checkpoint and its restore plan
