"""An operator's verification of a checkpoint's copy on one tier: every verified replica there is
read back on the right queue (`VerifyCheckpoint`, the scrub's read-back activity batch by batch) and
compared with its registered checksum. What reads back wrong is marked and its tier copy demoted in
the same transaction (`tierpoint/catalog/tier_copy/damage.py`), and the repair is requested.

One run per checkpoint and tier at a time: asking again while it runs joins it (and records
nothing new); asking after it finished reads the copy again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowFailureError

from tierpoint import logs
from tierpoint.catalog.checkpoint.shards import checkpoint_branch
from tierpoint.catalog.engine import AsyncSessions
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.reads.copies import verified_replicas
from tierpoint.catalog.stripe.scrub import checkpoint_stripes
from tierpoint.config import Settings
from tierpoint.contract.integrity import (
    VerifyCheckpointInput,
    VerifyOutcome,
    verify_checkpoint_workflow_id,
)
from tierpoint.errors import NothingToVerify, TemporalUnavailable
from tierpoint.temporal import start_verify_checkpoint

log = logs.get(__name__)

VERIFY = "verify"
# How long the request waits for the outcome before it answers "running".
VERIFY_WAIT = 10.0


@dataclass
class VerifyRun:
    job: str
    step: int
    tier: str
    workflow_id: str
    run_id: str | None
    joined: bool
    status: str = "running"  # running | completed | failed
    outcome: VerifyOutcome | None = None
    error: str | None = field(default=None)


async def verify_checkpoint(
    sessions: AsyncSessions,
    client: Client | None,
    settings: Settings,
    job: str,
    step: int,
    tier: str,
    actor: str,
    wait: float = VERIFY_WAIT,
    *,
    branch: int | None = None,
) -> VerifyRun:
    """The checkpoint at `step` (on `branch` when given, else the one on the job's timeline).
    Raises UnknownTier, JobNotFound, CheckpointNotFound, NothingToVerify (no verified replica
    there), TemporalUnavailable."""
    kind = settings.tier(tier).kind
    async with sessions() as session:
        cp = await session.run_sync(find_checkpoint, job, step, branch=branch)
        checkpoint_id, job_id = cp.id, cp.job_id
        saved_on = await session.run_sync(checkpoint_branch, checkpoint_id)
        if settings.tier(tier).stripe_code is None:
            verified = await session.run_sync(verified_replicas, checkpoint_id, tier)
        else:  # a coded tier keeps stripes
            verified = len(await session.run_sync(checkpoint_stripes, checkpoint_id, tier, 0, 1))
    wid = verify_checkpoint_workflow_id(job, step, tier, saved_on)
    if not verified:
        what = "stripe" if settings.tier(tier).stripe_code else "replica"
        raise NothingToVerify(f"{job}/{step} has no verified {what} on tier {tier!r}")
    if client is None:
        raise TemporalUnavailable("cannot read the copy back now: Temporal is unreachable")
    handle, started = await start_verify_checkpoint(
        client, VerifyCheckpointInput(checkpoint_id=checkpoint_id, tier=tier, kind=kind), wid
    )
    run_id = handle.result_run_id or handle.run_id
    if run_id is None:
        run_id = (await handle.describe()).run_id
    run = VerifyRun(job, step, tier, wid, run_id, joined=not started)
    if started:
        async with sessions() as session:
            await session.run_sync(
                record,
                EventKind.OPERATOR_ACTION,
                checkpoint_id=checkpoint_id,
                job_id=job_id,
                tier=tier,
                actor=actor,
                detail={"action": VERIFY, "workflow_id": wid, "run_id": run_id},
            )
            # Its own transaction: the run is recorded before the request waits on its outcome.
            await session.commit()
    try:
        run.outcome = await asyncio.wait_for(handle.result(), wait)
        run.status = "completed"
    except TimeoutError:
        log.info("verification still running", workflow_id=wid)
    except WorkflowFailureError as exc:
        run.status, run.error = "failed", str(exc.cause or exc)
    return run
