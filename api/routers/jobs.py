from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.auth import require
from api.deps import SessionDep
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor
from api.problems import problem_responses
from api.schemas.jobs import JobOut, JobPage
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
