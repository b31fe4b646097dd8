"""An operator's retry of a checkpoint whose copy failed on some tier (a file written after it
was registered, a tier that was down): a new lifecycle run, which re-runs every stage but skips
what is already verified, so only the failed stage and the ones after it do work."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from temporalio.client import Client

from tierpoint.catalog.checkpoint.shards import checkpoint_branch
from tierpoint.catalog.engine import AsyncSession
from tierpoint.catalog.tier_copy import retry
from tierpoint.contract.lifecycle import LifecycleInput, retry_workflow_id, workflow_id
from tierpoint.errors import NothingToRetry, TemporalUnavailable
from tierpoint.temporal import is_running, start_lifecycle


@dataclass(frozen=True)
class RetryOutcome:
    job: str
    step: int
    workflow_id: str
    attempt: int
    tiers: list[str]  # the tiers that had failed and are pending again


async def retry_checkpoint(
    session: AsyncSession,
    client: Client | None,
    job: str,
    step: int,
    actor: str,
    tiers: Sequence[str],
    local: Collection[str],
    branch: int | None = None,
) -> RetryOutcome:
    """Start the retry run and reset the failed tier copies, in that order and under their
    locks, so the run cannot promote (or fail) a tier before the reset commits. `tiers`: the
    configured tiers in order; `local`: the ones local to a node. The caller commits. Raises
    CheckpointNotFound, NothingToRetry (nothing failed, or a run is still open), and what
    `retry.refusal` says when a run could not help (NoVerifiedSource, CopyOnLostNode,
    RepairInProgress), TemporalUnavailable. `branch`: the checkpoint saved at the step on that
    branch (without it, the one on the job's timeline)."""
    target = await session.run_sync(retry.lock_failed, job, step, branch)
    if not target.failed:
        raise NothingToRetry(f"{job}/{step} has no failed tier: nothing to retry")
    refused = retry.refusal(job, step, tiers, local, target.facts)
    if refused is not None:
        raise refused
    if client is None:
        raise TemporalUnavailable("Temporal is unreachable: a retry needs a new lifecycle run")
    saved_on = await session.run_sync(checkpoint_branch, target.checkpoint_id)
    previous = (
        workflow_id(job, step, saved_on)
        if target.attempt == 1
        else retry_workflow_id(job, step, target.attempt - 1, saved_on)
    )
    if await is_running(client, previous):
        # Its promote activity will settle the failed tiers; a second run would race it.
        raise NothingToRetry(f"{job}/{step}: lifecycle run {previous} is still running")
    run = retry_workflow_id(job, step, target.attempt, saved_on)
    await start_lifecycle(
        client,
        LifecycleInput(checkpoint_id=target.checkpoint_id, job=job, step=step, branch=saved_on),
        run,
    )
    await session.run_sync(retry.reset_failed, target, actor, run)
    return RetryOutcome(job, step, run, target.attempt, sorted(target.failed))
