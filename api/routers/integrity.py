"""Integrity: scrub totals, reconciliation runs, and readers' reports of corrupt copies."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from temporalio.client import Client

from api.auth import Actor, require, require_job
from api.deps import BranchQuery, JobName, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.integrity import (
    CorruptCopyIn,
    CorruptCopyOut,
    ReconcileIn,
    ReconcileRunOut,
    ScrubOut,
    TierScrubOut,
)
from tierpoint.auth import Scope
from tierpoint.catalog.job.lookup import require_job_id
from tierpoint.catalog.replica import scrub
from tierpoint.contract.integrity import ReconcileInput
from tierpoint.errors import TemporalUnavailable
from tierpoint.services import corrupt_reports, reconcile
from tierpoint.storage.paths import validate_name

router = APIRouter(tags=["integrity"], route_class=GatedRoute)

RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="Reconciliation run id.")]


async def _client(state: StateDep) -> Client:
    client = await state.temporal.client()
    if client is None:
        raise TemporalUnavailable(
            f"Temporal is unreachable at {state.settings.temporal_address}; retry later"
        )
    return client


@router.get(
    "/v1/scrub",
    dependencies=[Depends(require(Scope.READ))],
    response_model=ScrubOut,
    summary="What the scrub has read and found",
)
async def scrub_status(state: StateDep) -> ScrubOut:
    settings = state.settings
    async with state.sessions() as session:
        views = await session.run_sync(scrub.overview, settings.tier_names())
    bandwidth = {t.name: t.scrub_bandwidth for t in settings.tiers}
    return ScrubOut(
        enabled=settings.scrub_enabled,
        interval_seconds=settings.scrub_interval.total_seconds(),
        min_age_seconds=settings.scrub_min_age.total_seconds(),
        tiers=[
            TierScrubOut(
                tier=v.tier,
                bandwidth=bandwidth[v.tier],
                replicas=v.replicas,
                stripes=v.stripes,
                bytes=v.bytes,
                corrupt=v.corrupt,
                lost=v.lost,
                last_scrubbed_at=v.last_scrubbed_at,
                oldest_read_at=v.oldest_read_at,
            )
            for v in views
        ],
    )


@router.post(
    "/v1/reconcile",
    dependencies=[Depends(require(Scope.OPERATE))],
    status_code=202,
    response_model=ReconcileRunOut,
    responses=problem_responses(404, 422, 503),
    summary="Compare the catalog with what the tiers hold (a run; poll its report)",
)
async def start_reconcile(body: ReconcileIn, state: StateDep) -> ReconcileRunOut:
    if body.tier is not None:
        state.settings.tier(body.tier, "body")  # UnknownTier
    if body.job is not None:
        validate_name(body.job)
        async with state.sessions() as session:
            await session.run_sync(require_job_id, body.job)
    client = await _client(state)
    run_id = await reconcile.start(
        client, ReconcileInput(tier=body.tier, job=body.job, repair=body.repair)
    )
    return ReconcileRunOut(id=run_id, status="running")


@router.get(
    "/v1/reconcile/{run_id}",
    dependencies=[Depends(require(Scope.READ, Scope.OPERATE))],
    response_model=ReconcileRunOut,
    responses=problem_responses(404, 422, 503),
    summary="A reconciliation run: its status and report (partial while it runs)",
)
async def reconcile_status(run_id: RunId, state: StateDep) -> ReconcileRunOut:
    return ReconcileRunOut(**await reconcile.status(await _client(state), run_id))


@router.post(
    "/v1/jobs/{job:path}/checkpoints/{step}/corrupt-copies",
    dependencies=[Depends(require_job(Scope.OPERATE))],
    status_code=202,
    response_model=CorruptCopyOut,
    responses=problem_responses(404, 422, 503),
    summary="Report a copy whose bytes did not match the registered checksum",
)
async def report_corrupt_copy(
    job: JobName,
    step: Step,
    body: CorruptCopyIn,
    state: StateDep,
    actor: Actor,
    branch: BranchQuery = None,
) -> CorruptCopyOut:
    """The server reads that replica back itself; only a confirmed mismatch marks it `corrupt`,
    takes its tier out of `restorable` and starts a repair. Reporting again changes nothing.
    `branch`: the checkpoint saved at the step on that branch (a reader names the one it read;
    without it, the one on the job's timeline)."""
    out = await corrupt_reports.report_corrupt_copy(
        state.sessions,
        await state.temporal.client(),
        state.settings,
        job,
        step,
        body.tier,
        body.path,
        body.reason,
        actor,
        branch=branch,
        stripe=body.stripe,
    )
    return CorruptCopyOut(**out)
