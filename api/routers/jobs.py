from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.auth import JOB_READ, LEASE_WRITE, REGISTER, PrincipalDep, require, require_token
from api.deps import JobName, SessionDep
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor
from api.problems import problem_responses
from api.schemas.jobs import JobAccess, JobOut, JobPage
from tierpoint.auth import Scope
from tierpoint.catalog.reads import jobs as job_reads
from tierpoint.json_types import Text

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=GatedRoute)


@router.get(
    "",
    response_model=JobPage,
    responses=problem_responses(422),
    summary="List jobs",
    dependencies=[Depends(require(Scope.READ))],
)
async def list_jobs(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[Text | None, Query(max_length=400)] = None,
) -> JobPage:
    after = decode_cursor(cursor, str) if cursor is not None else None
    jobs, last = await session.run_sync(job_reads.list_jobs, limit=limit, after_name=after)
    return JobPage(
        items=[JobOut.model_validate(j) for j in jobs],
        next_cursor=encode_cursor(last) if last is not None else None,
    )


@router.get(
    "/{job:path}/access",
    response_model=JobAccess,
    responses=problem_responses(422),
    summary="What the calling token may do with a job",
    dependencies=[Depends(require_token())],
)
async def job_access(job: JobName, principal: PrincipalDep) -> JobAccess:
    """Answered by the same rules the job's routes apply, so a client's check before a save
    (may this token register?) cannot drift from the registration's own. Any valid token may
    ask; the job need not exist yet (a first save asks before its job has a checkpoint)."""
    return JobAccess(
        job=job,
        token=principal.name,
        read=JOB_READ.allows(principal, job),
        register_=REGISTER.allows(principal, job),
        lease=LEASE_WRITE.allows(principal, job),
    )
