"""Operator views: the jobs overview with recovery points per tier, copies in flight, promotion
lag, tier usage, nodes, and a checkpoint's event history. Reads only. (The failures are in
`api/routers/failures.py`.)"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.auth import JOB_READ, require
from api.deps import BranchQuery, JobName, JobQuery, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor
from api.problems import problem_responses
from api.schemas.operations import (
    EventOut,
    EventPage,
    InFlightList,
    InFlightOut,
    JobOverviewOut,
    JobsOverviewPage,
    JobUsageOut,
    LagList,
    LagOut,
    NodeList,
    NodeOut,
    TierPointOut,
    TierUsageList,
    TierUsageSummaryOut,
)
from tierpoint.auth import Scope
from tierpoint.catalog.reads import operator, overview
from tierpoint.cost import held_bytes, monthly_cost
from tierpoint.json_types import Text
from tierpoint.storage.posix.space import disk_space
from tierpoint.tier_config import TierKind

router = APIRouter(prefix="/v1", tags=["operations"], route_class=GatedRoute)

JobFilter = JobQuery
# Jobs listed under each tier of the usage view.
TOP_JOBS = 10


@router.get(
    "/overview/jobs",
    dependencies=[Depends(require(Scope.READ))],
    response_model=JobsOverviewPage,
    responses=problem_responses(422),
    summary="Jobs with their recovery point, bytes and cost per tier, in-flight and failed",
)
async def jobs_overview(
    session: SessionDep,
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[Text | None, Query(max_length=400)] = None,
    prefix: Annotated[
        Text | None,
        Query(description="Only jobs whose name starts with this.", max_length=128),
    ] = None,
    job: JobFilter = None,
) -> JobsOverviewPage:
    after = decode_cursor(cursor, str) if cursor is not None else None
    tiers = state.settings.tiers
    views, last, now = await session.run_sync(
        overview.jobs_overview,
        [t.name for t in tiers],
        limit=limit,
        after_name=after,
        prefix=prefix,
        job=job,
    )
    items = []
    for v in views:
        points = [
            TierPointOut.model_validate({**vars(p), "monthly_cost": monthly_cost(tier, p.bytes)})
            for p, tier in zip(v.tiers, tiers, strict=True)
        ]
        items.append(
            JobOverviewOut.model_validate(
                {
                    **vars(v),
                    "tiers": points,
                    "monthly_cost": round(sum(p.monthly_cost for p in points), 6),
                }
            )
        )
    total = await session.run_sync(overview.count_jobs, prefix=prefix, job=job)
    return JobsOverviewPage(
        now=now,
        total=total,
        items=items,
        next_cursor=encode_cursor(last) if last is not None else None,
    )


@router.get(
    "/copies/in-flight",
    dependencies=[Depends(require(Scope.READ))],
    response_model=InFlightList,
    responses=problem_responses(422),
    summary="Tier copies still pending, oldest first, with progress, throughput and ETA",
)
async def copies_in_flight(
    session: SessionDep,
    state: StateDep,
    job: JobFilter = None,
    tier: Annotated[Text | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> InFlightList:
    names = state.settings.tier_names()
    if tier is not None:
        state.settings.tier(tier)  # UnknownTier
    views, now = await session.run_sync(operator.in_flight, names, job=job, tier=tier, limit=limit)
    total = await session.run_sync(operator.count_in_flight, job=job, tier=tier)
    return InFlightList(now=now, total=total, items=[InFlightOut.model_validate(v) for v in views])


@router.get(
    "/lag",
    dependencies=[Depends(require(Scope.READ))],
    response_model=LagList,
    responses=problem_responses(422),
    summary="Registration to restorable per job and tier: p50, p95, max over a window",
)
async def promotion_lag(
    session: SessionDep,
    job: JobFilter = None,
    window_seconds: Annotated[
        int, Query(ge=60, le=90 * 86400, description="Copies promoted within this window.")
    ] = 86400,
) -> LagList:
    window = timedelta(seconds=window_seconds)
    views, now = await session.run_sync(operator.promotion_lag, window, job=job)
    return LagList(
        now=now, window_seconds=window_seconds, items=[LagOut.model_validate(v) for v in views]
    )


@router.get(
    "/tiers/usage",
    dependencies=[Depends(require(Scope.READ))],
    response_model=TierUsageList,
    summary="Bytes, checkpoints and cost per tier and job; free space of shared POSIX tiers",
)
async def tiers_usage(session: SessionDep, state: StateDep) -> TierUsageList:
    rows = await session.run_sync(operator.tier_usage)
    by_tier: dict[str, list[JobUsageOut]] = defaultdict(list)
    for r in rows:
        by_tier[r.tier].append(JobUsageOut(job=r.job, bytes=r.bytes, checkpoints=r.checkpoints))
    items = []
    for t in state.settings.tiers:
        jobs = by_tier.get(t.name, [])
        total = sum(j.bytes for j in jobs)
        space = None
        if t.kind is TierKind.SHARED:
            space = await asyncio.to_thread(disk_space, t.root_for(None))
        items.append(
            TierUsageSummaryOut(
                tier=t.name,
                kind=t.kind.value,
                code=str(t.stripe_code) if t.stripe_code else None,
                bytes=total,
                held_bytes=held_bytes(t, total),
                checkpoints=sum(j.checkpoints for j in jobs),
                monthly_cost=monthly_cost(t, total),
                free_bytes=space[0] if space else None,
                capacity_bytes=space[1] if space else None,
                jobs=jobs[:TOP_JOBS],
            )
        )
    return TierUsageList(items=items)


@router.get(
    "/nodes",
    dependencies=[Depends(require(Scope.READ))],
    response_model=NodeList,
    summary="Nodes: failure domain, last seen, lost or not, local bytes held",
)
async def list_nodes(session: SessionDep) -> NodeList:
    return NodeList(
        items=[NodeOut.model_validate(n) for n in await session.run_sync(operator.nodes)]
    )


@router.get(
    "/jobs/{job:path}/checkpoints/{step}/events",
    dependencies=[Depends(JOB_READ)],
    response_model=EventPage,
    responses=problem_responses(404, 422),
    summary="A checkpoint's event history, oldest first",
)
async def checkpoint_events(
    job: JobName,
    step: Step,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    cursor: Annotated[Text | None, Query(max_length=400)] = None,
    branch: BranchQuery = None,
) -> EventPage:
    after = decode_cursor(cursor, int) if cursor is not None else None
    views, last = await session.run_sync(
        operator.checkpoint_events, job, step, limit=limit, after_id=after, branch=branch
    )
    return EventPage(
        items=[EventOut.model_validate(v) for v in views],
        next_cursor=encode_cursor(last) if last is not None else None,
    )
