"""An operator's retry of a checkpoint whose copy failed on some tier (a file written after it
was registered, a tier that was down): a new lifecycle run, which re-runs every stage but skips
what is already verified, so only the failed stage and the ones after it do work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from temporalio.client import Client

from tierpoint.catalog import retry_repo
from tierpoint.catalog.engine import AsyncSession
from tierpoint.contract.lifecycle import LifecycleInput, retry_workflow_id, workflow_id
from tierpoint.errors import NothingToRetry, NoVerifiedSource, TemporalUnavailable
from tierpoint.states import TierState
from tierpoint.temporal import is_running, start_lifecycle


@dataclass(frozen=True)
class RetryOutcome:
    job: str
    step: int
    workflow_id: str
    attempt: int
    tiers: list[str]  # the tiers that had failed and are pending again


# Markers a lifecycle run passes through on its way to a failed tier: it reseals or copies a
# pending or failed one, and copies on from a restorable one. Any other state (retention expired
# the copy) ends the run there, and the tiers after it would stay `pending` with no run to move
# them.
_PASSABLE = (TierState.RESTORABLE.value, TierState.PENDING.value, TierState.FAILED.value)


def refuse_without_source(
    job: str, step: int, tiers: Sequence[str], target: retry_repo.RetryTarget
) -> None:
    """NoVerifiedSource when a tier before the first failed one (in the tiers' order, the order
    the run copies in) holds no copy the run could start from, naming what is gone."""
    order = [t for t in tiers if t in target.markers]
    first = next((i for i, t in enumerate(order) if t in target.failed), None)
    if first is None:
        return  # failed tiers no longer configured: the run does not copy to them
    gone = {t: target.markers[t][0] for t in order[:first] if target.markers[t][0] not in _PASSABLE}
    if not gone:
        return
    what = ", ".join(f"{t} is {state}" for t, state in gone.items())
    failed = "; ".join(
        f"{t} failed: {reason or 'no reason recorded'}"
        for t, reason in sorted(target.failed.items())
    )
    raise NoVerifiedSource(
        f"{job}/{step} cannot be retried: the copies a new run would start from are gone "
        f"({what}); {failed}",
        extra={"gone": gone, "failed": sorted(target.failed)},
    )


async def retry_checkpoint(
    session: AsyncSession,
    client: Client | None,
    job: str,
    step: int,
    actor: str,
    tiers: Sequence[str],
) -> RetryOutcome:
    """Start the retry run and reset the failed markers, in that order and under the markers'
    locks, so the run cannot promote (or fail) a tier before the reset commits. `tiers`: the
    configured tiers in order. The caller commits. Raises CheckpointNotFound, NothingToRetry
    (nothing failed, or a run is still open), NoVerifiedSource (the run could never finish),
    TemporalUnavailable."""
    target = await session.run_sync(retry_repo.lock_failed, job, step)
    if not target.failed:
        raise NothingToRetry(f"{job}/{step} has no failed tier: nothing to retry")
    refuse_without_source(job, step, tiers, target)
    if client is None:
        raise TemporalUnavailable("Temporal is unreachable: a retry needs a new lifecycle run")
    previous = (
        workflow_id(job, step)
        if target.attempt == 1
        else retry_workflow_id(job, step, target.attempt - 1)
    )
    if await is_running(client, previous):
        # Its promote activity will settle the failed tiers; a second run would race it.
        raise NothingToRetry(f"{job}/{step}: lifecycle run {previous} is still running")
    run = retry_workflow_id(job, step, target.attempt)
    await start_lifecycle(
        client, LifecycleInput(checkpoint_id=target.checkpoint_id, job=job, step=step), run
    )
    await session.run_sync(retry_repo.reset_failed, target, actor, run)
    return RetryOutcome(job, step, run, target.attempt, sorted(target.failed))
