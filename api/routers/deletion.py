"""An admin's deletion of a checkpoint or of all a job's checkpoints. The bytes go through
retention's expiry (tier copy -> `expiring` committed first, then the copy deleted, then
`expired`); the deletion is recorded as an event with the actor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Query

from api import background
from api.auth import Actor, require, require_job
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.actions import DeletionOut
from tierpoint.auth import Scope
from tierpoint.catalog.checkpoint import deletion

router = APIRouter(prefix="/v1/jobs", tags=["operator actions"], route_class=GatedRoute)

Force = Annotated[
    bool,
    Query(description="Delete even if pinned, held by a restore lease or with a copy in flight."),
]


async def _delete(
    job: str,
    step: int | None,
    force: bool,
    session: SessionDep,
    state: StateDep,
    actor: str,
    tasks: BackgroundTasks,
    *,
    keep_newest: bool = False,
    branch: int | None = None,
) -> DeletionOut:
    out = await session.run_sync(
        lambda s: deletion.delete_checkpoints(
            s, job, step, actor, force=force, keep_newest=keep_newest, branch=branch
        )
    )
    if out.deleted:
        tasks.add_task(background.request_retention, state, [job], f"deleted by {actor}")
    return DeletionOut.model_validate(out)


@router.delete(
    "/{job:path}/checkpoints/{step}",
    dependencies=[Depends(require(Scope.ADMIN))],
    response_model=DeletionOut,
    status_code=202,
    responses=problem_responses(404, 409, 422),
    summary="Delete a checkpoint: every copy goes through retention's expiry",
)
async def delete_checkpoint(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    tasks: BackgroundTasks,
    force: Force = False,
    branch: BranchQuery = None,
) -> DeletionOut:
    """ "Latest" stops offering it at once; its copies are deleted by the job's retention run
    (asked for now; the periodic sweep otherwise). 409 `checkpoint_protected` while it is
    pinned, held by a restore lease or has a copy in flight, unless `force`. Deleting it again
    does nothing more. Its step may be registered again once every copy is expired (409
    `checkpoint_being_deleted` before)."""
    return await _delete(job, step, force, session, state, actor, tasks, branch=branch)


@router.post(
    "/{job:path}/checkpoints/{step}/purge",
    dependencies=[Depends(require_job())],
    response_model=DeletionOut,
    status_code=202,
    responses=problem_responses(404, 409, 422),
    summary="A training job's purge of one of its checkpoints (a trainer's `rm -r` of an old step)",
)
async def purge_checkpoint(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    tasks: BackgroundTasks,
    branch: BranchQuery = None,
) -> DeletionOut:
    """The job's own token (`train:<job>`) deletes one of its checkpoints as an admin's deletion
    does (its copies through retention's expiry), never with force: 409 `checkpoint_protected`
    while it is pinned, held by a restore lease, has a copy in flight, or is the job's newest
    restorable checkpoint (retention never expires that one either)."""
    return await _delete(
        job, step, False, session, state, actor, tasks, keep_newest=True, branch=branch
    )


@router.delete(
    "/{job}",
    dependencies=[Depends(require(Scope.ADMIN))],
    response_model=DeletionOut,
    status_code=202,
    responses=problem_responses(404, 409, 422),
    summary="Delete every checkpoint of a job",
)
async def delete_job(
    job: JobName,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    tasks: BackgroundTasks,
    force: Force = False,
    branch: BranchQuery = None,
) -> DeletionOut:
    """Every checkpoint of the job, as one checkpoint's deletion, all or none: 409
    `checkpoint_protected` names every step that is pinned, leased or in flight unless `force`.
    The job and its history stay."""
    return await _delete(job, None, force, session, state, actor, tasks)
