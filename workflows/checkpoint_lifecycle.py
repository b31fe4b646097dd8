"""CheckpointLifecycle: plan -> seal (local tier, on the shards' nodes) -> promote -> for each
next tier: copy+verify -> promote -> done.

Deterministic: no I/O, no clocks; every catalog write happens in an activity. The history grows
with batches (ranges of shard ordinals per node), never with shards, and at most
`parallelism` batch activities of a stage are in flight at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.schemas import (
        COPY_BATCH,
        PLAN,
        PROMOTE,
        SEAL_BATCH,
        Batch,
        BatchResult,
        CopyInput,
        Plan,
        PlanInput,
        PlanTier,
        PromoteInput,
        PromoteResult,
        SealInput,
    )
    from tierpoint.config import SHARED_TASK_QUEUE, TierKind, node_task_queue
    from tierpoint.lifecycle import LIFECYCLE_WORKFLOW, LifecycleInput
    from workflows.schemas import LifecycleResult, LifecycleStatus, TierOutcome

# Catalog-only activities: short, retried for as long as the catalog is down.
CATALOG_TIMEOUT = timedelta(minutes=2)
CATALOG_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
)
# Batch activities move bytes: long, heartbeating, resumed from their heartbeat on retry.
BATCH_TIMEOUT = timedelta(hours=12)
# Progress is reported per chunk (8 MiB on POSIX): at the slowest read limit a chunk must still
# arrive within this, i.e. read_bandwidth_limit >= ~150 kB/s.
BATCH_HEARTBEAT = timedelta(seconds=60)
BATCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=2),
    maximum_attempts=20,
    non_retryable_error_types=["UnsafePath", "UnknownTier", "WrongNode", "CheckpointNotFound"],
)


def _error_message(err: BaseException) -> str:
    cause = err.__cause__ if isinstance(err, ActivityError) and err.__cause__ else err
    return str(cause) or type(cause).__name__


@workflow.defn(name=LIFECYCLE_WORKFLOW)
class CheckpointLifecycle:
    def __init__(self) -> None:
        self._status = LifecycleStatus(stage="starting")

    @workflow.query
    def status(self) -> LifecycleStatus:
        return self._status

    @workflow.run
    async def run(self, inp: LifecycleInput) -> LifecycleResult:
        self._status.stage = "plan"
        plan = await workflow.execute_activity(
            PLAN,
            PlanInput(checkpoint_id=inp.checkpoint_id),
            result_type=Plan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        result = LifecycleResult(
            checkpoint_id=plan.checkpoint_id,
            shard_count=plan.shard_count,
            batches=len(plan.batches),
        )
        first, *later = plan.tiers

        self._status.stage = f"seal:{first.name}"
        error = await self._stage(plan, first, functools.partial(self._seal, plan, first))
        outcome = await self._promote(plan, first, later, error)
        result.tiers.append(outcome)

        source = first
        for i, tier in enumerate(later):
            if outcome.state != "restorable":
                break
            self._status.stage = f"copy:{tier.name}"
            error = await self._stage(plan, tier, functools.partial(self._copy, plan, source, tier))
            outcome = await self._promote(plan, tier, later[i + 1 :], error)
            result.tiers.append(outcome)
            source = tier
        if outcome.state != "restorable":
            # A failed tier's promote activity marked the later tiers failed in its transaction.
            # Any other state (retention took the tier over meanwhile) leaves them pending.
            failed = outcome.state == "failed"
            done = {t.tier for t in result.tiers}
            for t in plan.tiers:
                if t.name in done:
                    continue
                result.tiers.append(
                    TierOutcome(
                        tier=t.name,
                        state="failed" if failed else "pending",
                        reason=f"source tier {outcome.tier} failed"
                        if failed
                        else f"not copied: source tier {outcome.tier} is {outcome.state}",
                    )
                )
                if failed:
                    self._status.tiers_failed.append(t.name)
        self._status.stage = "done"
        return result

    async def _stage(
        self,
        plan: Plan,
        tier: PlanTier,
        run: Callable[[Batch], Awaitable[BatchResult]],
    ) -> str | None:
        """Run one activity per batch, at most tier.parallelism at once (a sliding window).

        Returns why the stage is incomplete, if a batch gave up after its retries; corrupt shards
        are not errors here: the promote activity reads them from the catalog.
        """
        window = asyncio.Semaphore(tier.parallelism)
        self._status.batches_total = len(plan.batches)
        self._status.batches_done = 0
        failures: list[str] = []

        async def one(batch: Batch) -> None:
            async with window:
                try:
                    await run(batch)
                except ActivityError as err:
                    failures.append(
                        f"batch {batch.node}[{batch.first}..{batch.last}]: {_error_message(err)}"
                    )
                self._status.batches_done += 1

        await asyncio.gather(*(one(b) for b in plan.batches))
        if not failures:
            return None
        return f"{len(failures)} of {len(plan.batches)} batches failed, first: {failures[0]}"

    def _batch_queue(self, batch: Batch, *tiers: PlanTier) -> str:
        if any(t.kind is TierKind.LOCAL for t in tiers):
            return node_task_queue(batch.node)
        return SHARED_TASK_QUEUE

    async def _seal(self, plan: Plan, tier: PlanTier, batch: Batch) -> BatchResult:
        result: BatchResult = await workflow.execute_activity(
            SEAL_BATCH,
            SealInput(
                checkpoint_id=plan.checkpoint_id,
                job=plan.job,
                step=plan.step,
                batch=batch,
                tier=tier.name,
            ),
            result_type=BatchResult,
            task_queue=self._batch_queue(batch, tier),
            start_to_close_timeout=BATCH_TIMEOUT,
            heartbeat_timeout=BATCH_HEARTBEAT,
            retry_policy=BATCH_RETRY,
        )
        return result

    async def _copy(
        self, plan: Plan, source: PlanTier, destination: PlanTier, batch: Batch
    ) -> BatchResult:
        result: BatchResult = await workflow.execute_activity(
            COPY_BATCH,
            CopyInput(
                checkpoint_id=plan.checkpoint_id,
                job=plan.job,
                step=plan.step,
                batch=batch,
                source=source.name,
                destination=destination.name,
            ),
            result_type=BatchResult,
            task_queue=self._batch_queue(batch, source, destination),
            start_to_close_timeout=BATCH_TIMEOUT,
            heartbeat_timeout=BATCH_HEARTBEAT,
            retry_policy=BATCH_RETRY,
        )
        return result

    async def _promote(
        self, plan: Plan, tier: PlanTier, later: list[PlanTier], error: str | None
    ) -> TierOutcome:
        self._status.stage = f"promote:{tier.name}"
        res = await workflow.execute_activity(
            PROMOTE,
            PromoteInput(
                checkpoint_id=plan.checkpoint_id,
                tier=tier.name,
                later_tiers=[t.name for t in later],
                stage_error=error,
            ),
            result_type=PromoteResult,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        if res.state == "restorable":
            self._status.tiers_done.append(tier.name)
        else:
            self._status.tiers_failed.append(tier.name)
        return TierOutcome(tier=res.tier, state=res.state, reason=res.reason)
