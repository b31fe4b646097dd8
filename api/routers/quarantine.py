"""Quarantine: take a checkpoint, or one tier's copy of it, out of latest restorable (a job that
failed to load it, or whose loss diverged right after loading), and lift it again. An operator's
quarantine (operate or admin) is evidence, which retention never expires; a training token's only
hides the checkpoint and leaves its copies to the job's policy (docs/security.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Query

from api import background
from api.auth import Actor, PrincipalDep, require, require_job
from api.deps import ApiState, BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.checkpoints import CheckpointOut
from api.schemas.quarantine import Quarantine
from tierpoint.auth import Scope
from tierpoint.catalog.holds.quarantine import set_quarantine
from tierpoint.catalog.reads import checkpoints
from tierpoint.tier_config import NAME_RE

router = APIRouter(prefix="/v1/jobs", tags=["quarantine"], route_class=GatedRoute)


async def _answer(
    state: ApiState, session: SessionDep, job: str, step: int, branch: int | None
) -> CheckpointOut:
    detail = await session.run_sync(
        checkpoints.get_checkpoint,
        job,
        step,
        state.settings.tiers,
        include_shards=False,
        branch=branch,
    )
    return CheckpointOut.model_validate(detail)


@router.post(
    "/{job:path}/checkpoints/{step}/quarantine",
    dependencies=[Depends(require_job(Scope.OPERATE))],
    response_model=CheckpointOut,
    responses=problem_responses(404, 409, 413, 422),
    summary="Quarantine a checkpoint (or one tier's copy): never restored from",
)
async def quarantine_checkpoint(
    job: JobName,
    step: Step,
    body: Quarantine,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    principal: PrincipalDep,
    branch: BranchQuery = None,
) -> CheckpointOut:
    """Latest restorable then serves the next best checkpoint and says why in `skipped`.
    Idempotent: the same request again changes nothing; a new reason replaces the old one.
    With operate or admin scope the quarantine is evidence: retention never expires it; with a
    training token it only hides the checkpoint, and its copies expire as the job's policy says
    (a job must not hold storage past its policy). 409 `copy_expiring` for a tier copy that
    retention is already deleting."""
    if body.tier is not None:
        state.settings.tier(body.tier, "body")  # UnknownTier
    await session.run_sync(
        set_quarantine,
        job,
        step,
        body.reason,
        tier=body.tier,
        actor=actor,
        # guard: quarantine-evidence-needs-operate
        evidence=principal.has(Scope.OPERATE),
        branch=branch,
    )
    out = await _answer(state, session, job, step, branch)
    return out


@router.delete(
    "/{job:path}/checkpoints/{step}/quarantine",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=CheckpointOut,
    responses=problem_responses(404, 422),
    summary="Lift a quarantine: the checkpoint (or the tier's copy) is restorable again",
)
async def lift_quarantine(
    job: JobName,
    step: Step,
    session: SessionDep,
    state: StateDep,
    actor: Actor,
    background_tasks: BackgroundTasks,
    tier: Annotated[
        str | None,
        Query(
            pattern=NAME_RE.pattern, description="Only this tier's copy; absent: the checkpoint."
        ),
    ] = None,
    branch: BranchQuery = None,
) -> CheckpointOut:
    """Idempotent: lifting a quarantine that is not there changes nothing."""
    if tier is not None:
        state.settings.tier(tier)  # UnknownTier
    changed = await session.run_sync(
        set_quarantine, job, step, None, tier=tier, actor=actor, branch=branch
    )
    out = await _answer(state, session, job, step, branch)
    if changed:
        # The copies are ordinary again: retention may now expire what its rules do not keep.
        background_tasks.add_task(background.request_retention, state, [job], "quarantine lifted")
    return out
