"""Pins: a pinned checkpoint never expires on any tier, whatever the policy or quota."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Depends

from api import background
from api.auth import Actor, require
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.leases import Pin
from tierpoint.auth import Scope
from tierpoint.catalog.holds import pins

router = APIRouter(prefix="/v1/jobs", tags=["pins"], route_class=GatedRoute)


@router.put(
    "/{job:path}/checkpoints/{step}/pin",
    response_model=Pin,
    responses=problem_responses(404, 409, 422),
    summary="Pin a checkpoint: it never expires anywhere",
    dependencies=[Depends(require(Scope.OPERATE))],
)
async def pin_checkpoint(
    job: JobName, step: Step, session: SessionDep, actor: Actor, branch: BranchQuery = None
) -> Pin:
    """409 `copy_expiring` (with `tiers`) while retention is deleting one of its copies: nothing
    is pinned then, as the pin could not keep that copy."""
    pin = await session.run_sync(pins.set_pinned, job, step, True, actor, branch)
    return Pin.model_validate(pin)


@router.delete(
    "/{job:path}/checkpoints/{step}/pin",
    response_model=Pin,
    responses=problem_responses(404, 422),
    summary="Unpin a checkpoint: the job's policy decides again",
    dependencies=[Depends(require(Scope.OPERATE))],
)
async def unpin_checkpoint(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
    branch: BranchQuery = None,
) -> Pin:
    pin = await session.run_sync(pins.set_pinned, job, step, False, actor, branch)
    if pin.changed:
        background_tasks.add_task(background.request_retention, state, [job], "checkpoint unpinned")
    return Pin.model_validate(pin)
