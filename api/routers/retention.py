"""Retention dry runs and usage per tier; shared pieces of the admin endpoints: the actor of a
change and the best-effort request for a retention run after it."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.deps import ApiState, JobName, SessionDep, StateDep
from api.problems import problem_responses
from api.schemas.policies import JobPolicy
from api.schemas.retention import DryRun, PlanRequest, PolicyUsed, TierUsageOut, Usage
from tierpoint import logs
from tierpoint.errors import InvalidPolicy, JobNotFound, UnknownTier
from tierpoint.retention import Policy, RetentionPlan, TierRef, check_tiers, plan, tier_refs
from tierpoint.retention.snapshot import AssignedPolicy, UnknownJob, dry_run, take_snapshot
from tierpoint.retention.trigger import request_retention

router = APIRouter(prefix="/v1/jobs", tags=["retention"])
log = logs.get(__name__)

# A retention request that takes longer than this is dropped (the periodic sweep catches up).
TRIGGER_TIMEOUT = 5.0

ANONYMOUS = "anonymous"


def actor_header(
    x_tierpoint_actor: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=128,
            pattern=r"^[^\x00-\x1f\x7f]+$",
            description="Who makes the change, recorded in its event (no authentication yet).",
        ),
    ] = None,
) -> str:
    return x_tierpoint_actor or ANONYMOUS


Actor = Annotated[str, Depends(actor_header)]


async def request_retention_runs(state: ApiState, jobs: Sequence[str], reason: str) -> None:
    """After the response: ask for a retention run of each job. Failures are logged, never
    returned: the change is committed, and the periodic sweep runs retention anyway."""
    if not jobs:
        return
    client = await state.temporal.client()
    if client is None:
        log.warning("retention not requested: temporal unreachable", jobs=len(jobs), reason=reason)
        return
    for job in jobs:
        try:
            await asyncio.wait_for(request_retention(client, job, reason), TRIGGER_TIMEOUT)
        except Exception as exc:
            log.warning("retention not requested", job=job, reason=reason, error=repr(exc))


def _errors(loc: Sequence[Any], msg: str, code: str) -> dict[str, Any]:
    field = ""
    for p in loc:
        field += f"[{p}]" if isinstance(p, int) else (f".{p}" if field else str(p))
    return {"loc": list(loc), "msg": msg, "field": field, "message": msg, "code": code}


def parse_policy(spec: object, tiers: Sequence[TierRef], prefix: Sequence[str]) -> Policy:
    """The document as a Policy that fits the configured tiers, else 422 naming the fields:
    `invalid_policy` for a bad document, `unknown_tier` for rules of tiers not configured."""
    try:
        policy = Policy.from_spec(spec)
    except ValidationError as exc:
        errors = [
            _errors([*prefix, *e["loc"]], e["msg"], e["type"])
            for e in exc.errors(include_url=False)
        ]
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidPolicy(f"{first['field']}: {first['msg']}{more}", errors=errors) from None
    problems = check_tiers(policy, tiers)
    if problems:
        names = ", ".join(t.name for t in tiers)
        unknown = [p for p in problems if len(p.loc) == 2 and p.loc[0] == "tiers"]
        errors = [
            _errors([*prefix, *p.loc], p.msg, "unknown_tier" if p in unknown else "invalid_policy")
            for p in problems
        ]
        detail = f"{errors[0]['field']}: {errors[0]['msg']}; tiers are {names}"
        if unknown:
            raise UnknownTier(detail, errors=errors)
        raise InvalidPolicy(detail, errors=errors)
    return policy


def job_policy(job: str, assigned: AssignedPolicy) -> JobPolicy:
    return JobPolicy(
        job=job,
        source=assigned.source,
        name=assigned.name,
        version=assigned.version,
        spec=assigned.policy.to_spec(),
    )


def _evaluate(
    session: Session, job: str, tiers: Sequence[TierRef], now: datetime, preview: Policy | None
) -> tuple[AssignedPolicy | None, RetentionPlan]:
    if preview is None:
        return dry_run(session, job, tiers, now)
    return None, plan(take_snapshot(session, job, tiers, now), preview, now)


async def evaluate(
    session: SessionDep, job: str, state: ApiState, preview: Policy | None = None
) -> tuple[AssignedPolicy | None, RetentionPlan]:
    """The dry run on one consistent snapshot (REPEATABLE READ), at the database's clock (the
    clock leases are written with)."""
    await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    now = await session.scalar(select(func.now()))
    assert now is not None
    try:
        return await session.run_sync(_evaluate, job, tier_refs(state.settings.tiers), now, preview)
    except UnknownJob:
        raise JobNotFound(f"no job named {job!r}") from None
    finally:
        await session.rollback()


@router.post(
    "/{job:path}/retention/plan",
    response_model=DryRun,
    responses=problem_responses(404, 422),
    summary="Dry run: what retention would expire now, where, and why",
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
    assigned, result = await evaluate(session, job, state, preview)
    if assigned is None:
        assert preview is not None
        used = PolicyUsed(source="preview", name=None, version=None, spec=preview.to_spec())
    else:
        used = PolicyUsed(
            source=assigned.source,
            name=assigned.name,
            version=assigned.version,
            spec=assigned.policy.to_spec(),
        )
    return DryRun(job=job, policy=used, plan=result)


@router.get(
    "/{job:path}/usage",
    response_model=Usage,
    responses=problem_responses(404, 422),
    summary="Bytes and checkpoints per tier for a job, now and after retention",
)
async def job_usage(job: JobName, session: SessionDep, state: StateDep) -> Usage:
    assigned, result = await evaluate(session, job, state)
    assert assigned is not None
    kept = Counter(k.tier for k in result.keeps)
    expiring = Counter(e.tier for e in result.expiries)
    unfinished = Counter(u.tier for u in result.unfinished)
    return Usage(
        job=job,
        now=result.now,
        policy=job_policy(job, assigned),
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
            )
            for u in result.usage
        ],
    )
