"""Request dependencies every router shares: the app's state, one catalog session per request,
and validated path parameters (job name, step). Who is asking (the token, the actor of a change,
the scope a route needs) is api/auth.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Query, Request
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError
from tierpoint_client.paths import NAME_RULE

from api.temporal_link import TemporalLink
from api.token_cache import TokenCache
from tierpoint.catalog.engine import AsyncEngine, AsyncSession, AsyncSessions
from tierpoint.config import Settings
from tierpoint.errors import UnsafePath
from tierpoint.manifest import MAX_BRANCH, MAX_STEP, step_in_range
from tierpoint.metrics_api import ApiMetrics
from tierpoint.storage.paths import validate_name
from tierpoint.tier_config import NAME_RE


@dataclass
class ApiState:
    settings: Settings
    metrics: ApiMetrics
    engine: AsyncEngine
    sessions: AsyncSessions
    temporal: TemporalLink
    tokens: TokenCache
    # boto3 S3 clients per tier name, for readiness checks (created on first use).
    s3_clients: dict[str, Any] = field(default_factory=dict)


def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.tierpoint
    return state


async def _state(request: Request) -> ApiState:
    # A coroutine, not a plain function: FastAPI runs a plain function dependency in its thread
    # pool, a hop to another thread and back for every request that names the state.
    return get_state(request)


StateDep = Annotated[ApiState, Depends(_state)]


async def get_session(state: StateDep) -> AsyncIterator[AsyncSession]:
    """The request's unit of work: one session, committed once when the handler returns and
    rolled back when it raises. Handlers do not commit. Function scope puts the commit before the
    response is sent (a 2xx means it is in the catalog) and before the background tasks run (so
    what they start, a retention run or a lifecycle, reads what the request wrote)."""
    async with state.sessions() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        await session.commit()


SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


def _job_name(value: str) -> str:
    try:
        return validate_name(value, "job name")
    except UnsafePath as exc:
        # The message as a value, not as the template: a name may hold braces.
        raise PydanticCustomError("invalid_job_name", "{reason}", {"reason": str(exc)}) from None


# The pattern is in the schema so that clients (and the schema fuzzer) know the rule, but not a
# constraint of the parameter: the validator alone refuses a name, with its own code and the rule
# in words (api/problems.py), where the constraint would answer with the bare regex.
_JOB_NAME_SCHEMA = {"pattern": NAME_RE.pattern}
_JOB_NAME_HELP = f"Job name: {NAME_RULE}."
JobName = Annotated[
    str,
    Path(
        description=_JOB_NAME_HELP,
        examples=["llama3-70b.run-7"],
        json_schema_extra=_JOB_NAME_SCHEMA,
    ),
    AfterValidator(_job_name),
]
# `?job=NAME` of the operator views: the same rule, the same refusal.
JobQuery = Annotated[
    str | None,
    Query(description=f"Only this job. {_JOB_NAME_HELP}", json_schema_extra=_JOB_NAME_SCHEMA),
    AfterValidator(_job_name),
]


# Bounded as registration bounds steps (0 <= step <= 2^53 - 1); beyond, `step_out_of_range`.
Step = Annotated[
    int,
    Path(
        ge=0,
        description="Training step of the checkpoint.",
        json_schema_extra={"maximum": MAX_STEP},
    ),
    AfterValidator(step_in_range),
]


# `?branch=N` of a route that names a checkpoint by its step: the one saved on branch N (a step
# saved again after a rollback is two checkpoints). Absent: the one on the job's timeline, else
# the newest superseded one (`catalog/locks.py: at_step`).
BranchQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_BRANCH, description="The checkpoint saved on this branch."),
]
# `?health=good` of the routes that choose a job's latest: only checkpoints certified good.
Health = Literal["good"]
HealthQuery = Annotated[
    Health | None,
    Query(description="`good`: the newest checkpoint certified good."),
]
