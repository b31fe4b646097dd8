"""Retention policies: create, list, show, revise, delete, history; assign one to a job.

Every change is an event (`policy_changed`) whose actor is the name of the request's token;
after a change that affects jobs, a retention run is requested for each of them (best effort)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Path, Query, Response

from api import background
from api.auth import JOB_READ, Actor, require
from api.deps import JobName, SessionDep, StateDep
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.policies import (
    POLICY_NAME_PATTERN,
    AssignPolicy,
    CreatePolicy,
    JobPolicy,
    PolicyChangeOut,
    PolicyHistory,
    PolicyList,
    PolicyOut,
    UpdatePolicy,
)
from tierpoint.auth import Scope
from tierpoint.catalog.policy import policies as repo
from tierpoint.retention import tier_refs
from tierpoint.services.retention import parse_policy, resolve_policy

router = APIRouter(tags=["policies"], route_class=GatedRoute)

PolicyName = Annotated[
    str, Path(pattern=POLICY_NAME_PATTERN, description="Policy name.", examples=["llama-70b"])
]


@router.post(
    "/v1/policies",
    status_code=201,
    response_model=PolicyOut,
    responses=problem_responses(409, 422),
    summary="Create a retention policy",
    dependencies=[Depends(require(Scope.ADMIN))],
)
async def create_policy(
    body: CreatePolicy,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
) -> PolicyOut:
    """422 `invalid_policy` (errors name the fields under `spec`) or `unknown_tier`; 409
    `policy_exists`. With `default: true` it replaces the current default policy."""
    policy = parse_policy(body.spec, tier_refs(state.settings.tiers), ("spec",))
    record = await session.run_sync(
        repo.create_policy, body.name, policy, default=body.default, actor=actor
    )
    affected = await session.run_sync(repo.assigned_jobs, body.name) if body.default else []
    background_tasks.add_task(
        background.request_retention, state, affected, f"policy {body.name} is default"
    )
    return PolicyOut.model_validate(record)


@router.get(
    "/v1/policies",
    response_model=PolicyList,
    summary="List retention policies",
    dependencies=[Depends(require(Scope.READ))],
)
async def list_policies(session: SessionDep) -> PolicyList:
    return PolicyList(
        items=[PolicyOut.model_validate(p) for p in await session.run_sync(repo.list_policies)]
    )


@router.get(
    "/v1/policies/{name}",
    response_model=PolicyOut,
    responses=problem_responses(404, 422),
    summary="One retention policy",
    dependencies=[Depends(require(Scope.READ))],
)
async def get_policy(name: PolicyName, session: SessionDep) -> PolicyOut:
    return PolicyOut.model_validate(await session.run_sync(repo.get_policy, name))


@router.get(
    "/v1/policies/{name}/history",
    response_model=PolicyHistory,
    responses=problem_responses(422),
    summary="Changes of a retention policy, newest first (versions with old and new document)",
    dependencies=[Depends(require(Scope.READ))],
)
async def policy_history(
    name: PolicyName,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> PolicyHistory:
    changes = await session.run_sync(repo.history, name, limit=limit)
    return PolicyHistory(name=name, items=[PolicyChangeOut.model_validate(c) for c in changes])


@router.put(
    "/v1/policies/{name}",
    response_model=PolicyOut,
    responses=problem_responses(404, 422),
    summary="Revise a retention policy (a different document is a new version)",
    dependencies=[Depends(require(Scope.ADMIN))],
)
async def update_policy(
    name: PolicyName,
    body: UpdatePolicy,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
) -> PolicyOut:
    policy = parse_policy(body.spec, tier_refs(state.settings.tiers), ("spec",))
    before = await session.run_sync(repo.assigned_jobs, name)
    record, changed = await session.run_sync(
        repo.update_policy, name, policy, default=body.default, actor=actor
    )
    after = await session.run_sync(repo.assigned_jobs, name)
    # A new document affects its jobs; a default change affects the jobs that gain it (the ones
    # that lose it gain the built-in policy, or the next default, which is requested there).
    affected = sorted(set(after) | (set(before) if changed else set()))
    if changed or set(after) != set(before):
        background_tasks.add_task(
            background.request_retention, state, affected, f"policy {name} changed"
        )
    return PolicyOut.model_validate(record)


@router.delete(
    "/v1/policies/{name}",
    status_code=204,
    responses=problem_responses(404, 409, 422),
    summary="Delete a retention policy that no job uses",
    dependencies=[Depends(require(Scope.ADMIN))],
)
async def delete_policy(name: PolicyName, session: SessionDep, actor: Actor) -> Response:
    """409 `policy_in_use` while it is assigned to a job or is the default."""
    await session.run_sync(repo.delete_policy, name, actor=actor)
    return Response(status_code=204)


@router.put(
    "/v1/jobs/{job:path}/policy",
    response_model=JobPolicy,
    responses=problem_responses(404, 422),
    summary="Assign a retention policy to a job (null: the default policy)",
    dependencies=[Depends(require(Scope.ADMIN))],
)
async def assign_policy(
    job: JobName,
    body: AssignPolicy,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
) -> JobPolicy:
    """The job need not have registered a checkpoint yet. Answers the policy that now applies."""
    previous, new = await session.run_sync(repo.assign_policy, job, body.policy, actor=actor)
    assigned = await resolve_policy(session, job)
    if previous != new:
        background_tasks.add_task(background.request_retention, state, [job], "policy assigned")
    return JobPolicy.of(job, assigned)


@router.get(
    "/v1/jobs/{job:path}/policy",
    response_model=JobPolicy,
    responses=problem_responses(404, 422),
    summary="The retention policy that applies to a job",
    dependencies=[Depends(JOB_READ)],
)
async def job_policy_of(job: JobName, session: SessionDep) -> JobPolicy:
    return JobPolicy.of(job, await resolve_policy(session, job))
