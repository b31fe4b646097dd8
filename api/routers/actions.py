"""Operator actions on a checkpoint. Each is recorded as an event with its actor, and doing it
twice does no more than doing it once."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import Actor, require
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.actions import AcknowledgeIn, AcknowledgeOut, RetryOut, VerifyIn, VerifyOut
from tierpoint import logs
from tierpoint.auth import Scope
from tierpoint.catalog.tier_copy import failures
from tierpoint.services.retry import retry_checkpoint
from tierpoint.services.verify import verify_checkpoint

router = APIRouter(prefix="/v1/jobs", tags=["operator actions"], route_class=GatedRoute)


@router.post(
    "/{job:path}/checkpoints/{step}/retry",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=RetryOut,
    status_code=202,
    responses=problem_responses(404, 409, 422, 503),
    summary="Retry a checkpoint's failed tiers with a new lifecycle run",
)
async def retry(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    branch: BranchQuery = None,
) -> RetryOut:
    """Failed tiers go back to `pending` and a new lifecycle run copies what is not verified yet
    (verified copies are kept as they are). 409 `nothing_to_retry` when no tier failed or the
    previous run is still open; and, when a run could not help (the failures view says so
    beforehand, in `retry`): 409 `no_verified_source` when a tier the run must copy from holds
    no copy any more (expired, say), naming them; 409 `copy_on_lost_node` when the failed copy
    was on a node declared lost; 409 `repair_in_progress` while a repair copies it back.
    Nothing changes on a 409. 503 `temporal_unavailable` without Temporal."""
    logs.bind_checkpoint(job=job, step=step)
    outcome = await retry_checkpoint(
        session,
        await state.temporal.client(),
        job,
        step,
        actor,
        state.settings.tier_names(),
        state.settings.local_tier_names(),
        branch,
    )
    return RetryOut.model_validate(outcome)


@router.post(
    "/{job:path}/checkpoints/{step}/verify",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=VerifyOut,
    status_code=202,
    responses=problem_responses(404, 409, 422, 503),
    summary="Read a checkpoint's copy on one tier back now and compare every checksum",
)
async def verify(
    job: JobName,
    step: Step,
    body: VerifyIn,
    state: StateDep,
    actor: Actor,
    branch: BranchQuery = None,
) -> VerifyOut:
    """Every verified replica there is read back; one that reads wrong is marked `corrupt` (or
    `lost`), the tier leaves `restorable` at once and a repair starts. Answers with the outcome if
    the run ends within a few seconds, else `running` (ask again: you join the same run). 409
    `nothing_to_verify` when the tier holds no verified replica of it."""
    state.settings.tier(body.tier, "body")  # UnknownTier
    run = await verify_checkpoint(
        state.sessions,
        await state.temporal.client(),
        state.settings,
        job,
        step,
        body.tier,
        actor,
        branch=branch,
    )
    return VerifyOut.model_validate(run)


@router.post(
    "/{job:path}/checkpoints/{step}/acknowledge",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=AcknowledgeOut,
    responses=problem_responses(404, 409, 422),
    summary="Acknowledge a checkpoint's failed copies: they leave the failures view",
)
async def acknowledge(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    body: AcknowledgeIn | None = None,
    branch: BranchQuery = None,
) -> AcknowledgeOut:
    """The failures (of one tier, or of every tier) leave the failures view and the jobs' failed
    counts, and stay in the checkpoint's history as `acknowledged` events with the actor. The
    copy is not retried nor deleted; a later change of it (a retry, a new failure) shows again.
    409 `nothing_to_acknowledge` when no such failure is open."""
    tier = body.tier if body is not None else None
    if tier is not None:
        state.settings.tier(tier, "body")  # UnknownTier
    done = await session.run_sync(failures.acknowledge, job, step, tier, actor, branch)
    return AcknowledgeOut(job=job, step=step, acknowledged=done)
