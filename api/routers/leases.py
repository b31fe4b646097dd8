"""Restore leases: while one is active (unreleased, not expired) the checkpoint cannot expire on
any tier. A restarting job takes one with the latest-restorable answer
(`GET .../checkpoints/latest?lease_ttl=N`) or on a given step here, renews it while it reads, and
releases it when done."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Path, Query, Response

from api import background
from api.auth import JOB_READ, LEASE_WRITE, Actor
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor
from api.problems import problem_responses
from api.schemas.leases import CreateLease, Lease, LeaseList, RenewLease
from tierpoint.catalog.holds import leases as repo
from tierpoint.json_types import Text
from tierpoint.manifest import MAX_INT64

router = APIRouter(prefix="/v1/jobs", tags=["leases"], route_class=GatedRoute)

LeaseId = Annotated[int, Path(ge=1, le=MAX_INT64, description="Lease id.")]


@router.post(
    "/{job:path}/checkpoints/{step}/leases",
    status_code=201,
    response_model=Lease,
    responses=problem_responses(404, 409, 422),
    summary="Take a restore lease on a checkpoint",
    dependencies=[Depends(LEASE_WRITE)],
)
async def create_lease(
    job: JobName,
    step: Step,
    body: CreateLease,
    session: SessionDep,
    actor: Actor,
    branch: BranchQuery = None,
) -> Lease:
    """409 `not_leasable` when the checkpoint is restorable from no tier."""
    lease = await session.run_sync(
        repo.create_lease, job, step, body.ttl_seconds, body.owner, actor, branch=branch
    )
    return Lease.model_validate(lease)


@router.get(
    "/{job:path}/checkpoints/{step}/leases",
    response_model=LeaseList,
    responses=problem_responses(404, 422),
    summary="Leases on a checkpoint (active ones unless all=true), in id order, a page at a time",
    dependencies=[Depends(JOB_READ)],
)
async def list_leases(
    job: JobName,
    step: Step,
    session: SessionDep,
    all_: Annotated[bool, Query(alias="all", description="Include released and expired.")] = False,
    branch: BranchQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[Text | None, Query(max_length=400)] = None,
) -> LeaseList:
    """`next_cursor` names the next page (null on the last); 422 `invalid_cursor` for a cursor
    this API did not return."""
    after = decode_cursor(cursor, int) if cursor is not None else None
    leases = await session.run_sync(
        repo.list_leases,
        job,
        step,
        include_ended=all_,
        branch=branch,
        after=after,
        limit=limit + 1,
    )
    page = leases[:limit]
    more = len(leases) > limit
    return LeaseList(
        items=[Lease.model_validate(x) for x in page],
        next_cursor=encode_cursor(page[-1].id) if more else None,
    )


@router.put(
    "/{job:path}/checkpoints/{step}/leases/{lease_id}",
    response_model=Lease,
    responses=problem_responses(404, 409, 422),
    summary="Renew a restore lease (expires ttl_seconds from now)",
    dependencies=[Depends(LEASE_WRITE)],
)
async def renew_lease(
    job: JobName,
    step: Step,
    lease_id: LeaseId,
    body: RenewLease,
    session: SessionDep,
    actor: Actor,
) -> Lease:
    """409 `lease_ended` for a released or expired lease: take a new one."""
    lease = await session.run_sync(repo.renew_lease, job, step, lease_id, body.ttl_seconds, actor)
    return Lease.model_validate(lease)


@router.delete(
    "/{job:path}/checkpoints/{step}/leases/{lease_id}",
    status_code=204,
    responses=problem_responses(404, 422),
    summary="Release a restore lease (idempotent)",
    dependencies=[Depends(LEASE_WRITE)],
)
async def release_lease(
    job: JobName,
    step: Step,
    lease_id: LeaseId,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
) -> Response:
    _, released = await session.run_sync(repo.release_lease, job, step, lease_id, actor)
    if released:
        background_tasks.add_task(background.request_retention_when_unleased, state, job, lease_id)
    return Response(status_code=204, background=background_tasks)
