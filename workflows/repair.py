"""CheckpointRepair: re-copy a checkpoint's damaged or missing replicas from tiers that still hold
them verified, and promote each repaired tier again (id `checkpoint/<job>/<step>/repair`, started
or signalled by `request_repair`).

A round plans (which tiers, which batches, on which queue), runs each tier's batches through a
sliding window of the tier's parallelism, then promotes the tier with the lifecycle's own promote
activity. Requests that arrive during a round coalesce into one more round; a run continues as new
after REPAIR_ROUNDS_PER_RUN rounds, and a round hands out at most REPAIR_BATCHES_PER_ROUND batches,
so the history stays bounded however many shards are damaged.

Deterministic: no I/O, no clocks; every read and write happens in an activity.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.common import (
        CATALOG_RETRY,
        CATALOG_TIMEOUT,
        SHARED_TASK_QUEUE,
        error_message,
        node_task_queue,
    )
    from tierpoint.contract.integrity import (
        READ_HEARTBEAT,
        REPAIR_AGAIN_PATCH,
        REPAIR_COPY,
        REPAIR_PLAN,
        REPAIR_ROUNDS_PER_RUN,
        REPAIR_SIGNAL,
        REPAIR_WORKFLOW,
        RepairBatch,
        RepairCopyInput,
        RepairInput,
        RepairOutcome,
        RepairPlan,
        RepairPlanInput,
        RepairRequest,
        RepairResult,
        RepairTier,
    )
    from tierpoint.contract.lifecycle import (
        BATCH_RETRY,
        BATCH_TIMEOUT,
        PROMOTE,
        BatchResult,
        PromoteInput,
        PromoteResult,
    )
    from tierpoint.states import TierState


@workflow.defn(name=REPAIR_WORKFLOW)
class CheckpointRepair:
    def __init__(self) -> None:
        self._requested = False
        self._reasons: list[str] = []
        self._result = RepairResult(checkpoint_id=0)

    @workflow.signal(name=REPAIR_SIGNAL)
    def request(self, req: RepairRequest) -> None:
        self._requested = True
        self._reasons = [*self._reasons, req.reason][-10:]

    @workflow.query
    def status(self) -> RepairResult:
        return self._result

    @workflow.run
    async def run(self, inp: RepairInput) -> RepairResult:
        self._result.checkpoint_id = inp.checkpoint_id
        self._result.rounds = inp.rounds_before
        self._requested = self._requested or inp.pending
        rounds = 0
        while self._requested:
            self._requested = False
            more = await self._round(inp)
            rounds += 1
            self._result.rounds += 1
            # A round that could not hand out everything goes on by itself.
            self._requested = self._requested or more
            if self._requested and (
                rounds >= REPAIR_ROUNDS_PER_RUN or workflow.info().is_continue_as_new_suggested()
            ):
                workflow.continue_as_new(
                    RepairInput(
                        checkpoint_id=inp.checkpoint_id,
                        job=inp.job,
                        step=inp.step,
                        pending=True,
                        rounds_before=self._result.rounds,
                    )
                )
        return self._result

    async def _round(self, inp: RepairInput) -> bool:
        plan: RepairPlan = await workflow.execute_activity(
            REPAIR_PLAN,
            RepairPlanInput(checkpoint_id=inp.checkpoint_id),
            result_type=RepairPlan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        self._result.left = plan.left
        found_bad = verified_now = failed = 0
        for tier in plan.tiers:
            this = await self._copy(plan, tier)
            found_bad += this.found_bad
            verified_now += this.verified_now
            res: PromoteResult = await workflow.execute_activity(
                PROMOTE,
                PromoteInput(
                    checkpoint_id=plan.checkpoint_id, tier=tier.tier, stage_error=this.error
                ),
                result_type=PromoteResult,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            failed += res.state != TierState.RESTORABLE
            outcome = RepairOutcome(tier=tier.tier, state=str(res.state), reason=res.reason)
            self._result.tiers = [t for t in self._result.tiers if t.tier != tier.tier] + [outcome]
        # What the round's plan knew may be stale by the time a later tier's batches ran: a
        # source verified at planning read back bad or gone (now marked so), or an earlier tier
        # of this round made a faster source verified, which moves shards to another queue. One
        # more round, planned from the catalog as it now is, finishes them; it is asked only
        # while rounds change something, so a shard with no source left cannot loop.
        again = found_bad > 0 or (failed > 0 and verified_now > 0)
        # guard: repair-again-after-stale-plan
        return plan.more or (again and workflow.patched(REPAIR_AGAIN_PATCH))

    async def _copy(self, plan: RepairPlan, tier: RepairTier) -> _Copied:
        window = asyncio.Semaphore(tier.parallelism)
        failures: list[str] = []
        results: list[BatchResult] = []

        async def one(rb: RepairBatch) -> None:
            b = rb.batch
            async with window:
                try:
                    res: BatchResult = await workflow.execute_activity(
                        REPAIR_COPY,
                        RepairCopyInput(
                            checkpoint_id=plan.checkpoint_id,
                            job=plan.job,
                            step=plan.step,
                            batch=b,
                            destination=tier.tier,
                        ),
                        result_type=BatchResult,
                        # A peer copy's batch runs on its holder (`runs_on`); every other
                        # batch has no holder, so it runs where recorded histories ran it.
                        task_queue=node_task_queue(b.runs_on) if rb.on_node else SHARED_TASK_QUEUE,
                        start_to_close_timeout=BATCH_TIMEOUT,
                        heartbeat_timeout=READ_HEARTBEAT,
                        retry_policy=BATCH_RETRY,
                    )
                    results.append(res)
                except ActivityError as err:
                    failures.append(f"repair {b.node}[{b.first}..{b.last}]: {error_message(err)}")

        await asyncio.gather(*(one(b) for b in tier.batches))
        error = None
        if failures:
            n = len(failures)
            error = f"{n} of {len(tier.batches)} repair batches failed, first: {failures[0]}"
        return _Copied(
            error=error,
            found_bad=sum(r.source_damaged for r in results),
            verified_now=sum(r.verified - r.skipped for r in results),
        )


@dataclass(frozen=True)
class _Copied:
    """What one tier's repair batches did."""

    error: str | None = None
    # Shards whose source replica a copy found bad: marked so, so that a new plan avoids it.
    found_bad: int = 0
    # Replicas verified by these copies that were not before.
    verified_now: int = 0
