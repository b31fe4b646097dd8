"""What the API does after a response is sent (FastAPI background tasks): start a registered
checkpoint's lifecycle, ask for retention runs after a change. Failures are logged and counted,
never returned: the commit already answered the caller, and the reconciler and the periodic
retention sweep catch up with anything missed here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from api.deps import ApiState
from tierpoint import logs
from tierpoint.catalog.engine import transact_async
from tierpoint.catalog.holds.leases import still_leased
from tierpoint.contract.lifecycle import LifecycleInput
from tierpoint.services.lifecycle_start import start_and_record
from tierpoint.services.retention import request_retention_runs

log = logs.get(__name__)

# A workflow start that takes longer than this is left to the reconciler.
WORKFLOW_START_TIMEOUT = 5.0


async def start_lifecycle(state: ApiState, ref: LifecycleInput) -> None:
    client = await state.temporal.client()
    if client is None:
        state.metrics.workflow_starts.labels("failed").inc()
        log.warning("workflow not started: temporal unreachable", job=ref.job, step=ref.step)
        return
    try:
        outcome = await asyncio.wait_for(
            start_and_record(client, transact_async(state.sessions), ref),
            timeout=WORKFLOW_START_TIMEOUT,
        )
    except Exception as exc:
        state.metrics.workflow_starts.labels("failed").inc()
        log.warning("workflow not started", job=ref.job, step=ref.step, error=repr(exc))
        return
    state.metrics.workflow_starts.labels("started" if outcome.created else "existing").inc()


async def request_retention(state: ApiState, jobs: Sequence[str], reason: str) -> None:
    if jobs:
        await request_retention_runs(await state.temporal.client(), jobs, reason)


async def request_retention_when_unleased(state: ApiState, job: str, lease_id: int) -> None:
    """After a lease's release committed: a retention run only if it left its checkpoint with no
    active lease. A storm's thousands of releases of one checkpoint otherwise each asked Temporal
    for a run (a signal in the job's retention history apiece) where only the last one can let
    a copy expire. A release whose read fails asks anyway."""
    try:
        async with state.sessions() as session:
            held = await session.run_sync(still_leased, lease_id)
    except Exception as exc:
        log.warning("lease release: leases left unknown", job=job, error=repr(exc))
        held = False
    # guard: last-release-requests-retention
    if not held:
        await request_retention(state, [job], "lease released")
