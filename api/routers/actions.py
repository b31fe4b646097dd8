"""Operator actions on a checkpoint. Each is recorded as an event with its actor, and doing it
twice does no more than doing it once."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import Actor, require
from api.deps import JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.actions import RetryOut, VerifyIn, VerifyOut
from tierpoint import logs
from tierpoint.auth import Scope
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
    job: JobName, step: Step, session: SessionDep, state: StateDep, actor: Actor
) -> RetryOut:
    """Failed tiers go back to `pending` and a new lifecycle run copies what is not verified yet
    (verified copies are kept as they are). 409 `nothing_to_retry` when no tier failed or the
    previous run is still open; 503 `temporal_unavailable` without Temporal."""
    logs.bind_checkpoint(job=job, step=step)
    outcome = await retry_checkpoint(session, await state.temporal.client(), job, step, actor)
    await session.commit()
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
    job: JobName, step: Step, body: VerifyIn, state: StateDep, actor: Actor
) -> VerifyOut:
    """Every verified replica there is read back; one that reads wrong is marked `corrupt` (or
    `lost`), the tier leaves `restorable` at once and a repair starts. Answers with the outcome if
    the run ends within a few seconds, else `running` (ask again: you join the same run). 409
    `nothing_to_verify` when the tier holds no verified replica of it."""
    run = await verify_checkpoint(
        state.sessions,
        await state.temporal.client(),
        state.settings,
        job,
        step,
        body.tier,
        actor,
    )
    return VerifyOut.model_validate(run)
