"""Reads behind the checkpoint endpoints: one checkpoint (with its tiers, shards and replicas) and a
page of a job's checkpoints. Reads only; the views are built in `checkpoint_views`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import job_id_by_name, no_checkpoint, no_job, require_job_id
from tierpoint.catalog.locks import at_step
from tierpoint.catalog.models import Checkpoint, Job, Replica, Shard, TierCopy
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads.checkpoint_views import CHECKPOINT_COLS, views
from tierpoint.catalog.reads.views import (
    CheckpointDetailView,
    CheckpointView,
    ReplicaView,
    ShardView,
)
from tierpoint.catalog.tier_copy import key_layouts
from tierpoint.storage.s3.layout import s3_object
from tierpoint.tier_config import TierConfig, TierKind


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
            select(*CHECKPOINT_COLS)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, at_step(step, branch))
        )
    ).all()
    if not rows:
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    view = views(session, job, rows, tiers)[0]
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
            select(*CHECKPOINT_COLS)
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
        q = select(*CHECKPOINT_COLS).where(Checkpoint.job_id == job_id)
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
        return views(session, job, rows, tiers), None
    page = rows[:limit]
    if rows[limit].step == page[-1].step:
        # The cursor is a step: a page ends where a step ends, so a step saved on several
        # branches is never split between two pages (unless one step fills a whole page).
        whole = [r for r in page if r.step != page[-1].step]
        page = whole or page
    return views(session, job, page, tiers), page[-1].step
