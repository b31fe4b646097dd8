"""The jobs overview: a page of jobs, each with its recovery point on every configured tier (the
newest restorable step and how long ago it was registered), the bytes it holds there, and its
open copies. Reads only; every query is bounded by the page's jobs (see operator.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, column, func, literal_column, or_, select, values
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.models import (
    RESTORABLE,
    Checkpoint,
    Job,
    JobTierUsage,
    RetentionPolicy,
    TierCopy,
)
from tierpoint.catalog.reads.operator import FAILED, PENDING
from tierpoint.catalog.reads.operator_views import JobOverviewView, TierPointView
from tierpoint.catalog.replica import scrub
from tierpoint.catalog.tier_copy.failures import unacknowledged


def jobs_overview(
    session: Session,
    tiers: Sequence[str],
    *,
    limit: int = 50,
    after_name: str | None = None,
    prefix: str | None = None,
    job: str | None = None,
) -> tuple[list[JobOverviewView], str | None, datetime]:
    """A page of jobs by name (those starting with `prefix`, or the one named `job`), each with
    its recovery point on every configured tier."""
    now = catalog_now(session)
    q = (
        select(Job.id, Job.name, RetentionPolicy.name.label("policy"))
        .outerjoin(RetentionPolicy, RetentionPolicy.id == Job.policy_id)
        .order_by(Job.name)
        .limit(limit + 1)
    )
    if after_name is not None:
        q = q.where(Job.name > after_name)
    if prefix:
        # Names are [A-Za-z0-9._-]: no LIKE metacharacter but the escaped ones.
        q = q.where(Job.name.startswith(prefix, autoescape=True))
    if job is not None:
        q = q.where(Job.name == job)
    jobs = session.execute(q).all()
    next_name = jobs[limit - 1].name if len(jobs) > limit else None
    jobs = jobs[:limit]
    if not jobs:
        return [], None, now
    ids = [j.id for j in jobs]
    page = _Page(
        heads=_heads(session, ids),
        points=_recovery_points(session, ids, tiers),
        held=_held(session, ids),
        open_counts=_open_counts(session, ids),
        throughput=scrub.read_throughput(session, tiers),
        now=now,
    )
    return [_job_view(j, tiers, page) for j in jobs], next_name, now


def count_jobs(session: Session, *, prefix: str | None = None, job: str | None = None) -> int:
    """How many jobs the overview lists over all its pages (with the same filters)."""
    q = select(func.count()).select_from(Job)
    if prefix:
        q = q.where(Job.name.startswith(prefix, autoescape=True))
    if job is not None:
        q = q.where(Job.name == job)
    return int(session.scalar(q) or 0)


@dataclass(frozen=True)
class _Page:
    heads: dict[int, Any]
    points: dict[tuple[int, str], Any]
    held: dict[tuple[int, str], tuple[int, int]]
    open_counts: dict[tuple[int, str], int]
    throughput: dict[str, float]
    now: datetime


def _heads(session: Session, ids: Sequence[int]) -> dict[int, Any]:
    """Each job's newest step on its timeline, its time and the count of its checkpoints."""
    # An admin's deleted checkpoints are history, not the job's progress; nor are those a
    # rollback superseded (they are counted: still listed and held).
    not_deleted = Checkpoint.deleted_at.is_(None)
    latest = (
        select(Checkpoint.step, Checkpoint.created_at)
        .where(Checkpoint.job_id == Job.id, not_deleted, Checkpoint.superseded_by.is_(None))
        .order_by(Checkpoint.step.desc())
        .limit(1)
        .lateral("latest")
    )
    count = select(func.count()).where(Checkpoint.job_id == Job.id, not_deleted).scalar_subquery()
    return {
        r.id: r
        for r in session.execute(
            select(Job.id, latest.c.step, latest.c.created_at, count.label("n"))
            .outerjoin(latest, literal_column("true"))
            .where(Job.id.in_(ids))
        )
    }


def _recovery_points(
    session: Session, ids: Sequence[int], tiers: Sequence[str]
) -> dict[tuple[int, str], Any]:
    """(job id, tier) -> the newest checkpoint of the job's timeline restorable there and not
    quarantined: what `latest?tier=` answers (a superseded checkpoint is never a recovery
    point, as it is never latest)."""
    if not tiers:
        return {}
    t = values(column("tier", String), name="t").data([(n,) for n in tiers])
    ct = TierCopy
    newest = (
        select(ct.step, ct.restorable_at, Checkpoint.created_at, Checkpoint.total_bytes)
        .join(Checkpoint, Checkpoint.id == ct.checkpoint_id)
        .where(
            ct.job_id == Job.id,
            ct.state == RESTORABLE,
            ct.tier == t.c.tier,
            ct.superseded.is_(False),
            ct.quarantine_reason.is_(None),
            Checkpoint.quarantine_reason.is_(None),
        )
        .order_by(ct.step.desc())
        .limit(1)
        .lateral("newest")
    )
    rows = session.execute(
        select(
            Job.id,
            t.c.tier,
            newest.c.step,
            newest.c.restorable_at,
            newest.c.created_at,
            newest.c.total_bytes,
        )
        .select_from(Job)
        .join(t, literal_column("true"))
        .join(newest, literal_column("true"))
        .where(Job.id.in_(ids))
    )
    return {(r.id, r.tier): r for r in rows}


def _held(session: Session, ids: Sequence[int]) -> dict[tuple[int, str], tuple[int, int]]:
    """(job id, tier) -> (bytes, checkpoints) held there."""
    # Running totals kept by the catalog's triggers: one row per job and tier, however long the
    # job's history (summing its tier copies grew with it).
    return {
        (u.job_id, u.tier): (int(u.bytes), int(u.checkpoints))
        for u in session.execute(
            select(
                JobTierUsage.job_id, JobTierUsage.tier, JobTierUsage.bytes, JobTierUsage.checkpoints
            ).where(JobTierUsage.job_id.in_(ids))
        )
    }


def _open_counts(session: Session, ids: Sequence[int]) -> dict[tuple[int, str], int]:
    """(job id, tier copy state) -> checkpoints pending, or failed and not acknowledged."""
    out: dict[tuple[int, str], int] = {}
    for o in session.execute(
        select(
            TierCopy.job_id,
            TierCopy.state,
            func.count(func.distinct(TierCopy.checkpoint_id)),
        )
        .where(
            TierCopy.job_id.in_(ids),
            or_(TierCopy.state == PENDING, unacknowledged()),
        )
        .group_by(TierCopy.job_id, TierCopy.state)
    ):
        out[(o[0], o[1])] = int(o[2])
    return out


def _job_view(j: Any, tiers: Sequence[str], page: _Page) -> JobOverviewView:
    head = page.heads[j.id]
    tier_views = []
    for name in tiers:
        p = page.points.get((j.id, name))
        nbytes, n = page.held.get((j.id, name), (0, 0))
        tier_views.append(
            TierPointView(
                tier=name,
                latest_step=p.step if p else None,
                latest_created_at=p.created_at if p else None,
                restorable_at=p.restorable_at if p else None,
                steps_behind=(head.step - p.step) if p and head.step is not None else None,
                age_seconds=(page.now - p.created_at).total_seconds() if p else None,
                bytes=nbytes,
                checkpoints=n,
                predicted_restore_seconds=(
                    p.total_bytes / page.throughput[name] if p and name in page.throughput else None
                ),
            )
        )
    behind = [v.steps_behind for v in tier_views if v.steps_behind is not None]
    return JobOverviewView(
        job=j.name,
        policy=j.policy,
        latest_step=head.step,
        latest_created_at=head.created_at,
        checkpoints=int(head.n),
        in_flight=page.open_counts.get((j.id, PENDING), 0),
        failed=page.open_counts.get((j.id, FAILED), 0),
        tiers=tier_views,
        steps_at_risk_durable=tier_views[-1].steps_behind if tier_views else None,
        steps_at_risk=min(behind, default=None),
    )
