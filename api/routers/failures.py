"""Failed tier copies: the list (with the total and whether a retry could help each one), and an
operator's acknowledgement of every failure of a job or with a reason. One checkpoint's failures
are acknowledged under the checkpoint (`api/routers/actions.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.auth import Actor, require
from api.deps import SessionDep, StateDep
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor, invalid_cursor
from api.problems import problem_responses
from api.routers.operations import JobFilter
from api.schemas.actions import (
    ACKNOWLEDGED_SHOWN,
    AcknowledgedOut,
    AcknowledgeMatchingIn,
    AcknowledgeMatchingOut,
)
from api.schemas.operations import FailureOut, FailurePage
from tierpoint.auth import Scope
from tierpoint.catalog.tier_copy import failures
from tierpoint.catalog.tier_copy.failures import FailureFilter
from tierpoint.errors import FilterRequired
from tierpoint.json_types import Text

router = APIRouter(prefix="/v1", tags=["operations"], route_class=GatedRoute)

ReasonFilter = Annotated[
    Text | None,
    Query(
        description="Only failures whose reason contains this text, in any case.",
        min_length=1,
        max_length=500,
    ),
]


@router.get(
    "/failures",
    dependencies=[Depends(require(Scope.READ))],
    response_model=FailurePage,
    responses=problem_responses(422),
    summary="Failed tier copies, newest first, with reason, last error and whether a retry helps",
)
async def list_failures(
    session: SessionDep,
    state: StateDep,
    job: JobFilter = None,
    reason: ReasonFilter = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[Text | None, Query(max_length=400)] = None,
) -> FailurePage:
    after = _failure_key(decode_cursor(cursor, list)) if cursor is not None else None
    settings = state.settings
    page = await session.run_sync(
        failures.failures,
        settings.tier_names(),
        settings.local_tier_names(),
        FailureFilter(job=job, reason=reason),
        limit=limit,
        after=after,
    )
    return FailurePage(
        now=page.now,
        total=page.total,
        items=[
            FailureOut.model_validate({**vars(v), "retryable": v.retryable}) for v in page.items
        ],
        next_cursor=encode_cursor(list(page.next_key)) if page.next_key is not None else None,
    )


def _failure_key(raw: list[object]) -> tuple[str, int, str]:
    match raw:
        case [str(at), int(cid), str(tier)]:
            try:
                datetime.fromisoformat(at)
            except ValueError:
                pass
            else:
                return at, cid, tier
    raise invalid_cursor()


@router.post(
    "/failures/acknowledge",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=AcknowledgeMatchingOut,
    responses=problem_responses(409, 422),
    summary="Acknowledge every open failure of a job, or whose reason contains some text",
)
async def acknowledge_failures(
    body: AcknowledgeMatchingIn, session: SessionDep, state: StateDep, actor: Actor
) -> AcknowledgeMatchingOut:
    """The matching failures leave the failures list and the jobs' failed counts, and each
    stays in its checkpoint's history as an `acknowledged` event with the actor and the filter.
    Nothing is copied or deleted; a later change of a copy (a retry, a new failure) lists it
    again. 422 `filter_required` without `job` or `reason` (acknowledging every failure at once
    takes a filter that says so); 409 `nothing_to_acknowledge` when nothing matches."""
    if body.job is None and body.reason is None:
        raise FilterRequired("say which failures to acknowledge: a job, a reason, or both")
    if body.tier is not None:
        state.settings.tier(body.tier, "body")  # UnknownTier
    matching = FailureFilter(job=body.job, reason=body.reason, tier=body.tier, until=body.until)
    done = await session.run_sync(failures.acknowledge_matching, matching, actor)
    return AcknowledgeMatchingOut(
        acknowledged=len(done),
        items=[AcknowledgedOut.model_validate(a) for a in done[:ACKNOWLEDGED_SHOWN]],
    )
