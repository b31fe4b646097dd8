"""A run's timeline (docs/api.md, "A run's timeline"): roll back to a step (a new branch), the
branches, fork a new job from another job's checkpoint, a checkpoint's health verdict and its
lineage. HTTP only: the catalog's `timeline/` package does the work in the request's one unit
of work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Query, Response

from api import background
from api.auth import JOB_READ, JOB_WRITE, Actor, PrincipalDep
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.checkpoints import CheckpointOut
from api.schemas.timeline import (
    BranchesOut,
    BranchOut,
    CheckpointRefOut,
    ForkIn,
    ForkOut,
    LineageOut,
    RollbackIn,
    RollbackOut,
    VerdictIn,
)
from tierpoint.catalog.reads import checkpoint_views, checkpoints
from tierpoint.catalog.timeline import branches, lineage, verdicts

router = APIRouter(prefix="/v1/jobs", tags=["timeline"], route_class=GatedRoute)


@router.post(
    "/{job:path}/rollback",
    status_code=201,
    response_model=RollbackOut,
    responses={
        200: {"model": RollbackOut, "description": "A retry: the branch it made."},
        **problem_responses(404, 409, 422),
    },
    summary="Roll back to a step: a new branch starts from it",
    dependencies=[Depends(JOB_WRITE)],
)
async def rollback(
    job: JobName,
    body: RollbackIn,
    response: Response,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
) -> RollbackOut:
    """The checkpoints after `step` on the timeline become superseded (listed, restorable by
    branch, never latest, expired first); nothing is deleted. The same rollback again answers
    200 with the same branch; a rollback that lost a race, 409 `rollback_conflict` naming the
    winner."""
    result = await session.run_sync(
        branches.rollback,
        job,
        body.step,
        from_branch=body.from_branch,
        reason=body.reason,
        actor=actor,
    )
    response.status_code = 201 if result.created else 200
    if result.superseded:
        # Superseded checkpoints are the first retention expires.
        background_tasks.add_task(background.request_retention, state, [job], "rollback")
    return RollbackOut.model_validate(result)


@router.get(
    "/{job:path}/branches",
    response_model=BranchesOut,
    responses=problem_responses(404, 422),
    summary="A job's branches",
    dependencies=[Depends(JOB_READ)],
)
async def list_branches(job: JobName, session: SessionDep) -> BranchesOut:
    current, items = await session.run_sync(branches.list_branches, job)
    return BranchesOut(job=job, current=current, items=[BranchOut.model_validate(b) for b in items])


@router.post(
    "/{job:path}/fork",
    status_code=201,
    response_model=ForkOut,
    responses={
        200: {"model": ForkOut, "description": "The same fork again."},
        **problem_responses(403, 404, 409, 422),
    },
    summary="Start a new job from another job's checkpoint",
    dependencies=[Depends(JOB_WRITE)],
)
async def fork_job(
    job: JobName,
    body: ForkIn,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    actor: Actor,
) -> ForkOut:
    """The token must also read the parent job (`read`, or a `train:` scope covering it)."""
    # guard: fork-reads-parent
    JOB_READ.check(principal, body.parent.job)
    result = await session.run_sync(
        lineage.fork,
        job,
        body.parent.job,
        body.parent.step,
        parent_branch=body.parent.branch,
        actor=actor,
    )
    refs = await session.run_sync(checkpoint_views.checkpoint_refs, [result.parent_id])
    response.status_code = 201 if result.created else 200
    return ForkOut(
        job=job,
        created=result.created,
        parent=CheckpointRefOut.model_validate(refs[result.parent_id]),
        created_at=result.created_at,
        created_by=result.created_by,
    )


@router.put(
    "/{job:path}/checkpoints/{step}/verdict",
    response_model=CheckpointOut,
    responses=problem_responses(403, 404, 409, 422),
    summary="Mark a checkpoint good, suspect or bad, with evidence",
    dependencies=[Depends(JOB_WRITE)],
)
async def give_verdict(
    job: JobName,
    step: Step,
    body: VerdictIn,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    branch: BranchQuery = None,
) -> CheckpointOut:
    """`bad` quarantines the checkpoint with the verdict as its evidence: never restored, kept by
    retention. Bad is final (409 `verdict_conflict`); the same verdict again changes nothing."""
    await session.run_sync(
        verdicts.give_verdict,
        job,
        step,
        body.verdict.value,
        branch=branch,
        metric=body.metric,
        value=body.value,
        at_step=body.at_step,
        detail=body.detail,
        actor=actor,
    )
    detail = await session.run_sync(
        checkpoints.get_checkpoint,
        job,
        step,
        state.settings.tiers,
        include_shards=False,
        branch=branch,
    )
    return CheckpointOut.model_validate(detail)


@router.get(
    "/{job:path}/checkpoints/{step}/lineage",
    response_model=LineageOut,
    responses=problem_responses(404, 422),
    summary="A checkpoint's ancestry and descendants",
    dependencies=[Depends(JOB_READ)],
)
async def checkpoint_lineage(
    job: JobName,
    step: Step,
    session: SessionDep,
    branch: BranchQuery = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> LineageOut:
    view = await session.run_sync(lineage.lineage, job, step, branch=branch, limit=limit)
    return LineageOut.model_validate(view)
