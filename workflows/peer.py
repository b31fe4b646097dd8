"""PeerRereplicate: after a node is declared lost, the peer copies it held are copied again to
the nodes that now follow their shards' nodes in the ring, and each peer tier is promoted again,
so a lost holder leaves its checkpoints with K copies once more.

Deterministic: the plan (which shards lack a verified peer copy, and their new holders) is an
activity; the copies are the lifecycle's own batch activities through the same window."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.common import CATALOG_RETRY, CATALOG_TIMEOUT, SHARED_TASK_QUEUE
    from tierpoint.contract.lifecycle import PROMOTE, PromoteInput, PromoteResult, StageInput
    from tierpoint.contract.peer import (
        PLAN,
        PLAN_RETRY,
        PLAN_TIMEOUT,
        REREPLICATE_WORKFLOW,
        PeerPlan,
        RereplicateInput,
    )

from workflows.lifecycle_window import LostNodes, run_window


@workflow.defn(name=REREPLICATE_WORKFLOW)
class PeerRereplicate:
    @workflow.run
    async def run(self, inp: RereplicateInput) -> list[PromoteResult]:
        plan: PeerPlan = await workflow.execute_activity(
            PLAN,
            inp,
            result_type=PeerPlan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=PLAN_TIMEOUT,
            retry_policy=PLAN_RETRY,
        )
        lost = LostNodes(plan.lost_nodes)
        outcomes = []
        for stage in plan.stages:
            done = await run_window(
                StageInput(
                    checkpoint_id=plan.checkpoint_id,
                    job=plan.job,
                    step=plan.step,
                    tier=stage.tier,
                    source=stage.source,
                    batches=stage.batches,
                    batch_heartbeat_seconds=plan.batch_heartbeat_seconds,
                    lost_nodes=plan.lost_nodes,
                    window_per_node=True,
                ),
                lost,
            )
            problems = [
                f"{done.failures} of {done.batches} batches failed, first: {done.first_failure}"
                if done.failures
                else "",
                f"{stage.unreachable} shard(s) whose own node is lost too"
                if stage.unreachable
                else "",
            ]
            error = "; ".join(p for p in problems if p) or None
            outcomes.append(
                await workflow.execute_activity(
                    PROMOTE,
                    PromoteInput(
                        checkpoint_id=plan.checkpoint_id, tier=stage.tier.name, stage_error=error
                    ),
                    result_type=PromoteResult,
                    task_queue=SHARED_TASK_QUEUE,
                    start_to_close_timeout=CATALOG_TIMEOUT,
                    retry_policy=CATALOG_RETRY,
                )
            )
        return outcomes
