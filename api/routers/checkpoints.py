"""Checkpoints: register, list, get one, and the latest restorable with its restore plan."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api import background
from api.auth import JOB_READ, LEASE_WRITE, REGISTER, Actor, PrincipalDep
from api.deps import BranchQuery, HealthQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.pagination import decode_cursor, encode_cursor
from api.problems import problem_responses
from api.schemas.checkpoints import (
    CheckpointDetailOut,
    CheckpointOut,
    CheckpointPage,
    RegisterCheckpoint,
    ShardStripesOut,
    ShardStripesPage,
)
from api.schemas.leases import LatestWithLease
from tierpoint import logs
from tierpoint.catalog.checkpoint import registration
from tierpoint.catalog.holds.leases import MAX_LEASE_SECONDS
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads import checkpoint_views, checkpoints, stripes
from tierpoint.contract.lifecycle import LifecycleInput
from tierpoint.errors import TierNotCoded
from tierpoint.json_types import Text
from tierpoint.manifest import MAX_BRANCH
from tierpoint.manifest_limits import check_limits
from tierpoint.manifest_parse import parse_manifest_json
from tierpoint.services.restore import LeaseRequest, latest_with_lease
from tierpoint.states import TierState

log = logs.get(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["checkpoints"], route_class=GatedRoute)


async def manifest_body(job: JobName, request: Request) -> RegisterCheckpoint:
    """The manifest, parsed and validated from the raw bytes in one pass (pydantic's JSON
    validator: about half the CPU of json.loads followed by validation). Taking `job` makes
    FastAPI refuse a bad job name before the body is read."""
    body = await request.body()
    try:
        return parse_manifest_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


@router.post(
    "/{job:path}/checkpoints",
    status_code=201,
    response_model=CheckpointOut,
    responses={
        200: {"model": CheckpointOut, "description": "The same manifest was already registered."},
        **problem_responses(409, 413, 422),
    },
    summary="Register a checkpoint",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Manifest"}}},
        }
    },
    dependencies=[Depends(REGISTER)],
)
async def register_checkpoint(
    job: JobName,
    manifest: Annotated[RegisterCheckpoint, Depends(manifest_body)],
    response: Response,
    background_tasks: BackgroundTasks,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
) -> CheckpointOut:
    """Record a checkpoint whose shards the job has written to its nodes' local tier. The catalog
    commit is the acknowledgement; the lifecycle workflow that copies the shards to slower tiers
    starts right after (or later through the reconciler if Temporal is unreachable).

    Registering the same manifest again answers 200 with the existing checkpoint; a different
    manifest for a registered step is a 409. Nothing is written for a refused request."""
    logs.bind_checkpoint(job=job, step=manifest.step)
    check_limits(
        manifest,
        max_shards=state.settings.max_shards_per_checkpoint,
        max_metadata_bytes=state.settings.max_metadata_bytes,
    )
    result = await session.run_sync(
        registration.register_checkpoint, job, manifest, state.settings.tier_names(), actor=actor
    )
    tiers = state.settings.tiers
    if result.created:
        parents = await session.run_sync(
            checkpoint_views.checkpoint_refs, [] if result.parent_id is None else [result.parent_id]
        )
        view = checkpoint_views.registered_view(
            job,
            result.checkpoint_id,
            result.created_at,
            manifest,
            tiers,
            branch=result.branch,
            parent=parents.get(result.parent_id) if result.parent_id is not None else None,
        )
    else:
        view = await session.run_sync(
            checkpoint_views.checkpoint_view, job, result.checkpoint_id, tiers
        )
    if result.created:
        response.status_code = 201
        state.metrics.registrations.labels("created").inc()
        state.metrics.registered_shards.inc(len(manifest.shards))
    else:
        response.status_code = 200
        state.metrics.registrations.labels("existing").inc()
    log.info(
        "checkpoint registered",
        created=result.created,
        shards=len(manifest.shards),
        tiers=state.settings.tier_names(),
    )
    if not result.workflow_started:
        background_tasks.add_task(
            background.start_lifecycle,
            state,
            LifecycleInput(
                checkpoint_id=result.checkpoint_id,
                job=job,
                step=manifest.step,
                registered_at=result.created_at,
                branch=result.branch,
            ),
        )
    return CheckpointOut.model_validate(view)


@router.get(
    "/{job:path}/checkpoints/latest",
    response_model=LatestWithLease,
    responses=problem_responses(404, 409, 422),
    summary="Latest restorable checkpoint and restore plan",
    dependencies=[Depends(JOB_READ)],
)
async def latest_restorable(
    job: JobName,
    session: SessionDep,
    state: StateDep,
    principal: PrincipalDep,
    tier: Annotated[Text | None, Query(description="Only restore from this tier.")] = None,
    node: Annotated[
        str | None,
        Query(
            description="The caller's node: its node-local copies count.",
            min_length=1,
            max_length=128,
            pattern=r"^[^\x00-\x1f\x7f]+$",
        ),
    ] = None,
    lease_ttl: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_LEASE_SECONDS,
            description="Also take a restore lease of this many seconds on the chosen checkpoint, "
            "atomically with the answer (returned as `lease`).",
        ),
    ] = None,
    owner: Annotated[
        str | None,
        Query(
            alias="holder",
            min_length=1,
            max_length=256,
            pattern=r"^[^\x00-\x1f\x7f]+$",
            description="Who takes the lease, recorded on it (with lease_ttl).",
        ),
    ] = None,
    branch: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_BRANCH,
            description="The newest on this branch's own timeline (superseded or not).",
        ),
    ] = None,
    health: HealthQuery = None,
) -> LatestWithLease:
    """The highest step the caller can restore, with the fastest verified source of each shard,
    and for every newer step why it was not chosen. 404 (`no_restorable_checkpoint`, with the
    same `skipped` list) when there is none. With `lease_ttl` the token also needs what taking a
    lease needs (train:<job> or operate). 422 `unknown_node` for a node no worker reported
    from."""
    if tier is not None:
        state.settings.tier(tier)  # UnknownTier
    if node is not None:
        await session.run_sync(registry.require_known, node)
    lease = None
    if lease_ttl is not None:
        LEASE_WRITE.check(principal, job)
        lease = LeaseRequest(lease_ttl, owner, principal.name)
    result = await latest_with_lease(
        session,
        job,
        state.settings.tiers,
        tier=tier,
        node=node,
        lease=lease,
        branch=branch,
        good=health == "good",
    )
    return LatestWithLease.model_validate(result)


@router.get(
    "/{job:path}/checkpoints/{step}",
    response_model=CheckpointDetailOut,
    responses=problem_responses(404, 422),
    summary="One checkpoint with its tiers and replicas",
    dependencies=[Depends(JOB_READ)],
)
async def get_checkpoint(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    shards: Annotated[bool, Query(description="Include shards and their replicas.")] = True,
    branch: BranchQuery = None,
) -> CheckpointDetailOut:
    detail = await session.run_sync(
        checkpoints.get_checkpoint,
        job,
        step,
        state.settings.tiers,
        include_shards=shards,
        branch=branch,
    )
    out = CheckpointDetailOut.model_validate(detail)
    if not shards:
        out.shards = None
    return out


@router.get(
    "/{job:path}/checkpoints",
    response_model=CheckpointPage,
    responses=problem_responses(404, 422),
    summary="A job's checkpoints, newest first",
    dependencies=[Depends(JOB_READ)],
)
async def list_checkpoints(
    job: JobName,
    session: SessionDep,
    state: StateDep,
    tier: Annotated[
        Text | None, Query(description="Only checkpoints with a tier copy on this tier.")
    ] = None,
    tier_state: Annotated[
        TierState | None,
        Query(
            alias="state",
            description="Only checkpoints with a tier copy in this state (on `tier` if given).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[Text | None, Query(max_length=200)] = None,
) -> CheckpointPage:
    if tier is not None:
        state.settings.tier(tier)  # UnknownTier
    before = decode_cursor(cursor, int) if cursor is not None else None
    items, next_step = await session.run_sync(
        checkpoints.list_checkpoints,
        job,
        state.settings.tiers,
        tier=tier,
        state=tier_state.value if tier_state is not None else None,
        limit=limit,
        before_step=before,
    )
    return CheckpointPage(
        items=[CheckpointOut.model_validate(i) for i in items],
        next_cursor=encode_cursor(next_step) if next_step is not None else None,
    )


@router.get(
    "/{job:path}/checkpoints/{step}/tiers/{tier}/stripes",
    response_model=ShardStripesPage,
    responses=problem_responses(404, 422),
    summary="A checkpoint's coded copy on a tier, shard by shard with its stripes",
    dependencies=[Depends(JOB_READ)],
)
async def list_stripes(
    job: JobName,
    step: Step,
    tier: Annotated[Text, Path(description="A coded peer tier.")],
    session: SessionDep,
    state: StateDep,
    branch: BranchQuery = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Shards per page.")] = 50,
    cursor: Annotated[Text | None, Query(max_length=200)] = None,
) -> ShardStripesPage:
    """Each shard's stripes on `tier` (index, holder, state, size, crc32c): where the copy's
    `coverage` comes from. Shards with no stripes yet are listed with none."""
    if state.settings.tier(tier, "path").code is None:
        raise TierNotCoded.named(tier)
    after = decode_cursor(cursor, int) if cursor is not None else None
    items, last = await session.run_sync(
        stripes.shard_stripes, job, step, tier, branch=branch, limit=limit, after=after
    )
    return ShardStripesPage(
        items=[ShardStripesOut.model_validate(i) for i in items],
        next_cursor=encode_cursor(last) if last is not None else None,
    )
