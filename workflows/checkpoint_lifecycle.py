"""CheckpointLifecycle: plan -> seal (local tier, on the shards' nodes) -> promote -> every next
tier at once: copy from the sealed tier + verify -> promote -> done. (Histories from before
FAN_OUT_PATCH copied tier after tier, each from the one before.)

Deterministic: no I/O, no clocks; every catalog write happens in an activity. The history grows
with batches (ranges of shard ordinals per node), never with shards, and at most
`parallelism` batch activities of a stage are in flight at once (per node in a stage on the
nodes' queues; workflows/lifecycle_window.py). Plan, promote and the retention requests are
local activities. A stage with more batches than `LifecyclePlan.batches_per_child`
(checkpoints spread over thousands of nodes) runs its batches in child workflows
(CheckpointLifecycleStage), so no history grows with nodes either: at once on the nodes' queues
(each node keeps its own window), one after the other on the shared queue (one window). So does
each pass of a coded tier's copy stage (encode, pull, unstage), the passes one after the other.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract import retention as retention_contract
    from tierpoint.contract.common import (
        CATALOG_RETRY,
        CATALOG_TIMEOUT,
        SHARED_TASK_QUEUE,
    )
    from tierpoint.contract.integrity import REPAIR_REQUEST, RepairStartInput
    from tierpoint.contract.lifecycle import (
        CODED_CHILDREN_PATCH,
        FAN_OUT_PATCH,
        LIFECYCLE_WORKFLOW,
        LOCAL_STEPS_PATCH,
        NODE_CHILDREN_PATCH,
        NODE_LOST_SIGNAL,
        PLAN,
        PROMOTE,
        RETENTION_PATCH,
        SOURCE_REPAIR_PATCH,
        STAGE_WORKFLOW,
        Batch,
        LifecycleInput,
        LifecyclePlan,
        LifecycleResult,
        LifecycleStatus,
        PlanInput,
        PlanTier,
        PromoteInput,
        PromoteResult,
        StageInput,
        StageResult,
        TierOutcome,
    )
    from tierpoint.states import TierState
    from tierpoint.tier_config import TierKind

from workflows.lifecycle_window import LostNodes, on_nodes_queues, run_coded_stage, run_window
from workflows.stage_children import StageChildren, merged

R = TypeVar("R")


@workflow.defn(name=STAGE_WORKFLOW)
class CheckpointLifecycleStage:
    """A slice of one stage's batches, for stages too large for the parent's history."""

    def __init__(self) -> None:
        self._lost = LostNodes()

    @workflow.signal(name=NODE_LOST_SIGNAL)
    def node_lost(self, node: str) -> None:
        self._lost.declare(node)

    @workflow.run
    async def run(self, inp: StageInput) -> StageResult:
        for node in inp.lost_nodes:
            self._lost.declare(node)
        return await run_window(inp, self._lost)


@workflow.defn(name=LIFECYCLE_WORKFLOW)
class CheckpointLifecycle:
    def __init__(self) -> None:
        self._status = LifecycleStatus(stage="starting")
        self._lost = LostNodes()
        self._children = StageChildren(self._status, self._lost)
        # LOCAL_STEPS_PATCH: catalog steps as local activities, node stages windowed per node.
        self._local_steps = False
        # Shards whose source replica a copy found corrupt.
        self._source_damaged = 0

    @workflow.query
    def status(self) -> LifecycleStatus:
        return self._status

    @workflow.signal(name=NODE_LOST_SIGNAL)
    async def node_lost(self, node: str) -> None:
        self._lost.declare(node)
        await self._children.pass_on(node)

    async def _catalog_step(self, name: str, arg: object, result_type: type[R]) -> R:
        """A step that only reads and writes the catalog (plan, promote). As a local activity it
        runs in this workflow's worker inside the workflow task that asked for it: one marker
        in the history instead of an activity task's three events, its round trip through the
        task queue and a workflow task of its own to deliver the result."""
        result: R
        if self._local_steps:
            result = await workflow.execute_local_activity(
                name,
                arg,
                result_type=result_type,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        else:
            result = await workflow.execute_activity(
                name,
                arg,
                result_type=result_type,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        return result

    @workflow.run
    async def run(self, inp: LifecycleInput) -> LifecycleResult:
        self._local_steps = workflow.patched(LOCAL_STEPS_PATCH)
        self._status.stage = "plan"
        plan = await self._catalog_step(
            PLAN, PlanInput(checkpoint_id=inp.checkpoint_id), LifecyclePlan
        )
        for node in plan.lost_nodes:
            self._lost.declare(node)
        result = LifecycleResult(
            checkpoint_id=plan.checkpoint_id,
            shard_count=plan.shard_count,
            batches=len(plan.batches),
        )
        first, *later = plan.tiers

        self._status.stage = f"seal:{first.name}"
        error = await self._stage(plan, first, None)
        outcome = await self._promote(plan, first, later, error)
        result.tiers.append(outcome)

        if outcome.state is TierState.RESTORABLE and later:
            if workflow.patched(FAN_OUT_PATCH):
                await self._fan_out(plan, first, later, result)
            else:
                outcome = await self._chain(plan, first, later, result)
        if outcome.state is not TierState.RESTORABLE:
            # A failed tier's promote activity marked the later tiers failed in its transaction.
            # Any other state (retention took the tier over meanwhile) leaves them pending.
            failed = outcome.state is TierState.FAILED
            done = {t.tier for t in result.tiers}
            for t in plan.tiers:
                if t.name in done:
                    continue
                result.tiers.append(
                    TierOutcome(
                        tier=t.name,
                        state=TierState.FAILED if failed else TierState.PENDING,
                        reason=f"source tier {outcome.tier} failed"
                        if failed
                        else f"not copied: source tier {outcome.tier} is {outcome.state}",
                    )
                )
                if failed:
                    self._status.tiers_failed.append(t.name)
        # guard: lifecycle-repairs-corrupt-source
        if self._source_damaged and workflow.patched(SOURCE_REPAIR_PATCH):
            await self._request_repair(plan)
        self._status.stage = "done"
        return result

    async def _fan_out(
        self, plan: LifecyclePlan, source: PlanTier, tiers: list[PlanTier], result: LifecycleResult
    ) -> None:
        """Every later tier copies from the sealed tier at once, each through its own window
        of `parallelism` (the node's read bandwidth limit is shared by all readers of its
        local tier), and is promoted on its own: a copy waits for nothing but its verified
        source, and a tier that fails fails no other. Each copy is verified on its own tier as
        in the chain; only its source differs (the sealed tier, the fastest verified one)."""
        self._status.stage = "copy:" + "+".join(t.name for t in tiers)
        self._status.batches_total = self._status.batches_done = 0

        async def copy(tier: PlanTier) -> TierOutcome:
            error = await self._stage(plan, tier, source)
            return await self._promote(plan, tier, [], error)

        result.tiers.extend(await asyncio.gather(*(copy(t) for t in tiers)))

    async def _chain(
        self, plan: LifecyclePlan, first: PlanTier, later: list[PlanTier], result: LifecycleResult
    ) -> TierOutcome:
        """Histories from before the fan-out: tier after tier, each copied from the one before
        (a peer tier from the same source, a side branch); a failed tier fails the later ones.
        Returns the last outcome on the chain."""
        outcome = result.tiers[-1]
        source = first
        for i, tier in enumerate(later):
            if outcome.state is not TierState.RESTORABLE:
                break
            self._status.stage = f"copy:{tier.name}"
            self._status.batches_total = self._status.batches_done = 0
            if tier.kind is TierKind.PEER:
                # A side branch: a peer copy speeds a lost node's restore up but gates nothing,
                # so its failure (too few serving nodes, a holder lost) fails no later tier, and
                # the next tier copies from the same source.
                error = await self._stage(plan, tier, source)
                result.tiers.append(await self._promote(plan, tier, [], error))
                continue
            error = await self._stage(plan, tier, source)
            outcome = await self._promote(plan, tier, later[i + 1 :], error)
            result.tiers.append(outcome)
            source = tier
        return outcome

    async def _stage(
        self, plan: LifecyclePlan, tier: PlanTier, source: PlanTier | None
    ) -> str | None:
        """Run a stage's batches; returns why the stage is incomplete, if it is."""
        if tier.code is not None and source is not None:
            # Only plans made since coded tiers exist name a code: recorded histories never
            # come here, so their commands are unchanged.
            error, damaged = await run_coded_stage(
                plan,
                tier,
                source,
                self._lost,
                lambda stage: self._coded_pass(plan, stage),
                self._status,
            )
            self._source_damaged += damaged
            return error
        unplaced: list[str] = []
        all_batches = plan.batches
        if tier.kind is TierKind.PEER:
            all_batches, unplaced = plan.peer_batches(tier.name)
        self._status.batches_total += len(all_batches)
        size = plan.batches_per_child

        def stage(batches: list[Batch]) -> StageInput:
            return StageInput(
                checkpoint_id=plan.checkpoint_id,
                job=plan.job,
                step=plan.step,
                tier=tier,
                source=source,
                batches=batches,
                batch_heartbeat_seconds=plan.batch_heartbeat_seconds,
                lost_nodes=sorted(self._lost.nodes),
                window_per_node=self._local_steps,
            )

        if len(all_batches) <= size:
            results = [await run_window(stage(all_batches), self._lost, self._status)]
        else:
            kind = "seal" if source is None else "copy"
            # Each node copies within its own window, so the children of a stage on the nodes'
            # queues run at once: one after the other, a stage over 10,000 nodes would have
            # only one child's nodes working at a time.
            at_once = (
                self._local_steps
                and on_nodes_queues(tier, source)
                and workflow.patched(NODE_CHILDREN_PATCH)
            )
            results = await self._children.run(
                f"{kind}-{tier.name}", all_batches, size, stage, at_once=at_once
            )
        self._source_damaged += sum(r.source_damaged for r in results)
        if unplaced:
            return f"no live node to hold a copy for nodes {', '.join(unplaced)}"
        failed = sum(r.failures for r in results)
        if not failed:
            return None
        first = next(r.first_failure for r in results if r.first_failure)
        return f"{failed} of {len(all_batches)} batches failed, first: {first}"

    async def _coded_pass(self, plan: LifecyclePlan, stage: StageInput) -> StageResult:
        """One pass of a coded tier's copy stage, in the lifecycle while it has no more batches
        than a child would, else in children as any stage: encode, pull and unstage are a batch
        per node (a pull one per holder of each node's set), so at 1,000 nodes rs(8,2) is
        12,000 activities. A run under way before keeps running every pass here."""
        size = plan.batches_per_child
        # guard: coded-passes-in-children
        # guard: coded-children-behind-patch
        if len(stage.batches) <= size or not workflow.patched(CODED_CHILDREN_PATCH):
            return await run_window(stage, self._lost, self._status)

        def slice_of(batches: list[Batch]) -> StageInput:
            nodes = {b.node for b in batches}
            return stage.model_copy(
                update={
                    "batches": batches,
                    "lost_nodes": sorted(self._lost.nodes),
                    # Only its own nodes' holders: the whole map in every child's input would
                    # grow the lifecycle's history with nodes times children.
                    "stripe_holders": {n: h for n, h in stage.stripe_holders.items() if n in nodes},
                }
            )

        # A holder pulls stripes of several nodes' sets: sorted by the node that runs them, its
        # pulls share a child and so its one window.
        batches = sorted(stage.batches, key=lambda b: b.runs_on)
        # On the nodes' queues, every node in its own window: the children run at once.
        results = await self._children.run(
            f"{stage.stripes}-{stage.tier.name}", batches, size, slice_of, at_once=True
        )
        return merged(results)

    async def _promote(
        self, plan: LifecyclePlan, tier: PlanTier, later: list[PlanTier], error: str | None
    ) -> TierOutcome:
        self._status.stage = f"promote:{tier.name}"
        res = await self._catalog_step(
            PROMOTE,
            PromoteInput(
                checkpoint_id=plan.checkpoint_id,
                tier=tier.name,
                later_tiers=[t.name for t in later],
                stage_error=error,
            ),
            PromoteResult,
        )
        if res.state is TierState.RESTORABLE:
            self._status.tiers_done.append(tier.name)
            # LOCAL_STEPS_PATCH came after RETENTION_PATCH: no need to record both.
            # guard: lifecycle-no-request
            if self._local_steps or workflow.patched(RETENTION_PATCH):
                await self._request_retention(plan, tier)
        else:
            self._status.tiers_failed.append(tier.name)
        return TierOutcome(tier=res.tier, state=res.state, reason=res.reason)

    async def _request_repair(self, plan: LifecyclePlan) -> None:
        """A copy found a source replica corrupt: that tier was demoted, as a scrub's finding
        demotes it, and now, with every tier copy of this run settled, repair copies the damaged
        shards again from a tier that still holds them verified (the demoted source, and the
        tiers that could not be copied from it)."""
        self._status.stage = "repair-requested"
        try:
            await workflow.execute_activity(
                REPAIR_REQUEST,
                RepairStartInput(
                    checkpoint_ids=[plan.checkpoint_id],
                    reason=f"a copy found {self._source_damaged} source replica(s) corrupt",
                ),
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        except ActivityError:
            # The damaged tier is demoted either way, so nothing reads it; an operator's retry
            # of the failed tiers copies it again.
            workflow.logger.warning("could not request repair of step %s", plan.step)

    async def _request_retention(self, plan: LifecyclePlan, tier: PlanTier) -> None:
        """A new restorable copy can let older copies go (a local copy waits for a durable one;
        keep_last counts restorable copies): ask for the job's retention run. Requests coalesce
        in the job's one JobRetention workflow, so one per promotion is cheap."""
        request = retention_contract.RequestInput(
            job=plan.job, reason=f"step {plan.step} restorable on {tier.name}"
        )
        try:
            if self._local_steps:
                await workflow.execute_local_activity(
                    retention_contract.REQUEST,
                    request,
                    start_to_close_timeout=CATALOG_TIMEOUT,
                    retry_policy=retention_contract.REQUEST_RETRY,
                )
            else:
                await workflow.execute_activity(
                    retention_contract.REQUEST,
                    request,
                    task_queue=SHARED_TASK_QUEUE,
                    start_to_close_timeout=CATALOG_TIMEOUT,
                    retry_policy=retention_contract.REQUEST_RETRY,
                )
        except ActivityError:
            # The checkpoint is safe either way; only cleanup waits for the next sweep.
            workflow.logger.warning("could not request retention for job %s", plan.job)
