"""PeerRereplicate: after a node is declared lost, the peer copies it held are copied again to
the nodes that now follow their shards' nodes in the ring, and each peer tier is promoted again,
so a lost holder leaves its checkpoints with K copies once more.

Deterministic: the plan (which shards lack a verified peer copy, and their new holders) is an
activity; the copies are the lifecycle's own batch activities through the same window. The plan's
stages (one per tier: full copies copied again, a coded tier's stripes cut again) run at the same
time, each promoting its tier when its batches are done.

A node declared lost while a run is under way (a new holder among them) is signalled to the run,
as to a lifecycle: its batches are cancelled rather than retried on a queue no worker will serve
again, the tiers are promoted with what was verified, and the run continues as new, so the next
plan places the shards still lacking a copy on the serving nodes of then.

Retention's expiry of a peer copy starts a run too (or tells the one under way to plan again)
when the checkpoint has a failed peer copy: that copy may have failed for want of a node free of
the shards' other copies, and the expiry freed one."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.common import CATALOG_RETRY, CATALOG_TIMEOUT, SHARED_TASK_QUEUE
    from tierpoint.contract.lifecycle import (
        NODE_LOST_SIGNAL,
        PROMOTE,
        PromoteInput,
        PromoteResult,
        StageInput,
        StripePhase,
    )
    from tierpoint.contract.peer import (
        PLAN,
        PLAN_RETRY,
        PLAN_TIMEOUT,
        REPLAN_SIGNAL,
        REREPLICATE_WORKFLOW,
        PeerPlan,
        PeerStage,
        RereplicateInput,
    )

from workflows.lifecycle_window import LostNodes, run_window

# Runs recorded before a lost node was signalled to a running re-replication ignore the signal.
LOST_DURING_RUN_PATCH = "peer-rereplicate-lost-during-run"
# Runs recorded before the stages ran together ran them one after another.
STAGES_TOGETHER_PATCH = "peer-rereplicate-stages-together"


@workflow.defn(name=REREPLICATE_WORKFLOW)
class PeerRereplicate:
    def __init__(self) -> None:
        self._lost = LostNodes()
        # Nodes declared lost after this run planned: its plan may have placed copies on them.
        self._lost_since_plan: set[str] = set()
        # Asked to plan again since this run planned: a node its plan could not use may be free.
        self._replan = False

    @workflow.signal(name=NODE_LOST_SIGNAL)
    def node_lost(self, node: str) -> None:
        if not workflow.patched(LOST_DURING_RUN_PATCH):
            return
        if node not in self._lost.nodes:
            self._lost_since_plan.add(node)
        self._lost.declare(node)

    @workflow.signal(name=REPLAN_SIGNAL)
    def replan(self) -> None:
        # Runs recorded before this signal existed never received it: no patch needed.
        self._replan = True

    @workflow.run
    async def run(self, inp: RereplicateInput) -> list[PromoteResult]:
        # A loss signalled so far (with the start, by the declaration that started this run)
        # committed before the plan reads the catalog: the plan knows it.
        self._lost_since_plan.clear()
        self._replan = False
        plan: PeerPlan = await workflow.execute_activity(
            PLAN,
            inp,
            result_type=PeerPlan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=PLAN_TIMEOUT,
            retry_policy=PLAN_RETRY,
        )
        self._lost.nodes |= set(plan.lost_nodes)
        stages = [self._stage(plan, stage) for stage in plan.stages]
        if workflow.patched(STAGES_TOGETHER_PATCH):
            # Each stage writes its own tier from copies verified when the plan was made, so
            # none waits on another: a coded tier's rebuild runs beside the full copies' copy.
            outcomes = list(await asyncio.gather(*stages))
        else:
            outcomes = [await stage for stage in stages]
        if self._lost_since_plan or self._replan:
            # Promoted above with what was verified; the next run plans the rest again on the
            # nodes alive and free now. Bounded: each run follows the loss of a node not lost
            # before, or the expiry of a peer copy that freed a node.
            # guard: rereplicate-plans-again-after-loss
            workflow.continue_as_new(inp)
        return outcomes

    async def _stage(self, plan: PeerPlan, stage: PeerStage) -> PromoteResult:
        """One tier's copies (or a coded tier's stripes) made again, then that tier promoted."""
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
                # A coded tier's stage cuts its lost stripes again on their new holders;
                # only plans made since coded tiers are rebuilt name a code.
                stripes=StripePhase.REBUILD if stage.tier.code is not None else None,
            ),
            self._lost,
        )
        problems = [
            f"{done.failures} of {done.batches} batches failed, first: {done.first_failure}"
            if done.failures
            else "",
            f"{stage.unreachable} shard(s) that no other tier holds verified on a live node"
            if stage.unreachable
            else "",
            f"no live node to hold a copy for nodes {', '.join(stage.unplaced)} apart from "
            "their own and the holders of their other copies"
            if stage.unplaced
            else "",
        ]
        error = "; ".join(p for p in problems if p) or None
        promoted: PromoteResult = await workflow.execute_activity(
            PROMOTE,
            PromoteInput(checkpoint_id=plan.checkpoint_id, tier=stage.tier.name, stage_error=error),
            result_type=PromoteResult,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        return promoted
