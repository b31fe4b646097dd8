"""Retention dry runs and usage per tier."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import APIRouter, Body, Depends

from api.auth import JOB_READ
from api.deps import JobName, SessionDep, StateDep
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.policies import JobPolicy
from api.schemas.retention import (
    CostComparison,
    CostOut,
    DryRun,
    PlanRequest,
    PolicyUsed,
    TierUsageOut,
    Usage,
)
from tierpoint.retention import tier_refs
from tierpoint.services.retention import evaluate, parse_policy

router = APIRouter(prefix="/v1/jobs", tags=["retention"], route_class=GatedRoute)


@router.post(
    "/{job:path}/retention/plan",
    response_model=DryRun,
    responses=problem_responses(404, 422),
    summary="Dry run: what retention would expire now, where, and why",
    dependencies=[Depends(JOB_READ)],
)
async def retention_plan(
    job: JobName,
    session: SessionDep,
    state: StateDep,
    body: Annotated[PlanRequest | None, Body()] = None,
) -> DryRun:
    """Every copy that would expire now (tier, step, bytes, the rule that decided it), every
    restorable copy that stays with all its reasons, deletions already under way, and usage per
    tier now and after. Changes nothing. With `policy` in the body, previews that document
    instead of the job's policy."""
    tiers = tier_refs(state.settings.tiers)
    preview = (
        parse_policy(body.policy, tiers, ("policy",))
        if body is not None and body.policy is not None
        else None
    )
    found = await evaluate(session, job, tiers, preview)
    cost = CostOut.of(state.settings.tiers, found.plan)
    compared = None
    if preview is not None:
        used = PolicyUsed(source="preview", name=None, version=None, spec=preview.to_spec())
        assert found.baseline is not None
        current = CostOut.of(state.settings.tiers, found.baseline)
        compared = CostComparison(
            current_policy_monthly_cost_after=current.monthly_cost_after,
            monthly_cost_delta=round(cost.monthly_cost_after - current.monthly_cost_after, 6),
        )
    else:
        assigned = found.assigned
        used = PolicyUsed(
            source=assigned.source,
            name=assigned.name,
            version=assigned.version,
            spec=assigned.policy.to_spec(),
        )
    return DryRun(job=job, policy=used, plan=found.plan, cost=cost, compared_to_current=compared)


@router.get(
    "/{job:path}/usage",
    response_model=Usage,
    responses=problem_responses(404, 422),
    summary="Bytes and checkpoints per tier for a job, now and after retention",
    dependencies=[Depends(JOB_READ)],
)
async def job_usage(job: JobName, session: SessionDep, state: StateDep) -> Usage:
    found = await evaluate(session, job, tier_refs(state.settings.tiers))
    result = found.plan
    cost = CostOut.of(state.settings.tiers, result)
    costs = {c.tier: c for c in cost.tiers}
    kept = Counter(k.tier for k in result.keeps)
    expiring = Counter(e.tier for e in result.expiries)
    unfinished = Counter(u.tier for u in result.unfinished)
    return Usage(
        job=job,
        now=result.now,
        policy=JobPolicy.of(job, found.assigned),
        monthly_cost_now=cost.monthly_cost_now,
        monthly_cost_after=cost.monthly_cost_after,
        tiers=[
            TierUsageOut(
                tier=u.tier,
                kind=u.kind,
                bytes_now=u.bytes_now,
                bytes_after=u.bytes_after,
                checkpoints_now=kept[u.tier] + expiring[u.tier],
                checkpoints_after=kept[u.tier],
                expiring=expiring[u.tier] + unfinished[u.tier],
                max_bytes=u.max_bytes,
                quota_met=u.quota_met,
                over_by=u.over_by,
                price_per_gb_month=costs[u.tier].price_per_gb_month,
                monthly_cost_now=costs[u.tier].monthly_cost_now,
                monthly_cost_after=costs[u.tier].monthly_cost_after,
            )
            for u in result.usage
        ],
    )
