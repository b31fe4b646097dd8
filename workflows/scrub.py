"""The scrub: `Scrub` (started by the `tierpoint.scrub` schedule) runs one `ScrubUnit` child per
tier (and node, for a local or peer tier: a peer unit is the copies one node holds for others,
a coded peer tier's unit the stripes it holds); a unit picks the replicas (or stripes) read
longest ago and reads them back batch by batch at the tier's scrub
bandwidth until its budget (bandwidth x interval) is spent or nothing is due. `VerifyReplicas`
reads named replicas back now (a reader reported them bad); `VerifyCheckpoint` reads every
verified replica of one checkpoint on one tier (an operator asked).

Whatever a read finds bad is already marked and demoted by the activity; the workflow asks for the
repair of the checkpoints it names. Histories stay bounded: a unit runs at most
SCRUB_BATCHES_PER_RUN batches (the next scheduled run goes on), the parent continues as new after
SCRUB_UNITS_PER_RUN units, and payloads are replica ids.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.common import (
        CATALOG_RETRY,
        CATALOG_TIMEOUT,
        SHARED_TASK_QUEUE,
        node_task_queue,
    )
    from tierpoint.contract.integrity import (
        NODE_QUEUE_WAIT,
        READ_HEARTBEAT,
        READ_RETRY,
        READ_TIMEOUT,
        REPAIR_REQUEST,
        SCRUB_BATCH,
        SCRUB_BATCHES_PER_RUN,
        SCRUB_PICK,
        SCRUB_PLAN,
        SCRUB_UNIT_WINDOW,
        SCRUB_UNIT_WORKFLOW,
        SCRUB_UNITS_PER_RUN,
        SCRUB_WORKFLOW,
        VERIFY_CHECKPOINT_WORKFLOW,
        VERIFY_PICK,
        VERIFY_WORKFLOW,
        RepairStartInput,
        ScrubBatchInput,
        ScrubBatchResult,
        ScrubInput,
        ScrubPick,
        ScrubPickInput,
        ScrubPlan,
        ScrubResult,
        ScrubUnit,
        ScrubUnitResult,
        VerifyCheckpointInput,
        VerifyInput,
        VerifyOutcome,
        VerifyPick,
        VerifyPickInput,
    )
    from tierpoint.tier_config import TierKind

# Every named replica is read, however recently it was.
READ_ALL = "9999-12-31T00:00:00+00:00"


def _queue(kind: TierKind, node: str | None) -> str:
    # A local copy is read on its node, a peer copy on its holder (the replica's node); every
    # unit of these kinds names its node, so histories of local units route as they did.
    on_nodes = kind in (TierKind.LOCAL, TierKind.PEER)
    return node_task_queue(node) if on_nodes and node else SHARED_TASK_QUEUE


async def _read_back(inp: ScrubBatchInput, kind: TierKind) -> ScrubBatchResult:
    res: ScrubBatchResult = await workflow.execute_activity(
        SCRUB_BATCH,
        inp,
        result_type=ScrubBatchResult,
        task_queue=_queue(kind, inp.node),
        schedule_to_start_timeout=NODE_QUEUE_WAIT if inp.node else None,
        start_to_close_timeout=READ_TIMEOUT,
        heartbeat_timeout=READ_HEARTBEAT,
        retry_policy=READ_RETRY,
    )
    if res.damaged:
        await workflow.execute_activity(
            REPAIR_REQUEST,
            RepairStartInput(
                checkpoint_ids=res.damaged,
                reason=f"{inp.actor} found {res.corrupt} corrupt, {res.lost} lost on {inp.tier}",
            ),
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
    return res


@workflow.defn(name=SCRUB_UNIT_WORKFLOW)
class ScrubUnitRun:
    @workflow.run
    async def run(self, unit: ScrubUnit) -> ScrubUnitResult:
        out = ScrubUnitResult(tier=unit.tier, node=unit.node)
        budget = unit.budget
        cutoff = ""
        while budget > 0 and out.batches < SCRUB_BATCHES_PER_RUN:
            pick: ScrubPick = await workflow.execute_activity(
                SCRUB_PICK,
                ScrubPickInput(unit=unit, budget=budget, cutoff=cutoff),
                result_type=ScrubPick,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            # Old histories' picks carry no stripe ids: they stop where they stopped.
            if not pick.replica_ids and not pick.stripe_ids:
                break
            cutoff = pick.picked_at
            res = await _read_back(
                ScrubBatchInput(
                    tier=unit.tier,
                    node=unit.node,
                    replica_ids=pick.replica_ids,
                    stripe_ids=pick.stripe_ids,
                    bandwidth=unit.bandwidth,
                    picked_at=pick.picked_at,
                ),
                unit.kind,
            )
            out.batches += 1
            out.replicas += res.replicas
            out.stripes += res.stripes
            out.bytes += res.bytes
            out.corrupt += res.corrupt
            out.lost += res.lost
            budget -= max(pick.bytes, 1)
        return out


@workflow.defn(name=SCRUB_WORKFLOW)
class Scrub:
    @workflow.run
    async def run(self, inp: ScrubInput) -> ScrubResult:
        plan: ScrubPlan = await workflow.execute_activity(
            SCRUB_PLAN,
            result_type=ScrubPlan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        units = plan.units[inp.offset : inp.offset + SCRUB_UNITS_PER_RUN]
        window = asyncio.Semaphore(SCRUB_UNIT_WINDOW)
        total = ScrubResult()
        parent = workflow.info().workflow_id

        async def one(unit: ScrubUnit) -> None:
            async with window:
                try:
                    res: ScrubUnitResult = await workflow.execute_child_workflow(
                        SCRUB_UNIT_WORKFLOW,
                        unit,
                        id=f"{parent}/{unit.tier}/{unit.node or 'all'}",
                        result_type=ScrubUnitResult,
                    )
                except ChildWorkflowError:
                    workflow.logger.warning("scrub of %s/%s failed", unit.tier, unit.node)
                    return
                total.units += 1
                total.replicas += res.replicas
                total.stripes += res.stripes
                total.bytes += res.bytes
                total.corrupt += res.corrupt
                total.lost += res.lost

        await asyncio.gather(*(one(u) for u in units))
        if inp.offset + SCRUB_UNITS_PER_RUN < len(plan.units):
            workflow.continue_as_new(ScrubInput(offset=inp.offset + SCRUB_UNITS_PER_RUN))
        return total


@workflow.defn(name=VERIFY_WORKFLOW)
class VerifyReplicas:
    @workflow.run
    async def run(self, inp: VerifyInput) -> ScrubBatchResult:
        kind = TierKind.LOCAL if inp.node else TierKind.SHARED
        return await _read_back(
            ScrubBatchInput(
                tier=inp.tier,
                node=inp.node,
                replica_ids=inp.replica_ids,
                stripe_ids=inp.stripe_ids,
                bandwidth=0,
                picked_at=READ_ALL,
                actor=inp.actor,
            ),
            kind,
        )


@workflow.defn(name=VERIFY_CHECKPOINT_WORKFLOW)
class VerifyCheckpoint:
    """Pick by pick (ids in replica id order, so history stays bounded: it continues as new after
    `picks_per_run` picks, VERIFY_PICKS_PER_RUN, carrying its totals), each batch read on its
    node's queue."""

    @workflow.run
    async def run(self, inp: VerifyCheckpointInput) -> VerifyOutcome:
        out = inp.so_far
        after = inp.after_id
        for _ in range(inp.picks_per_run):
            pick: VerifyPick = await workflow.execute_activity(
                VERIFY_PICK,
                VerifyPickInput(
                    checkpoint_id=inp.checkpoint_id,
                    tier=inp.tier,
                    after_id=after,
                    limit=inp.pick_limit,
                ),
                result_type=VerifyPick,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            for batch in pick.batches:
                res = await _read_back(
                    ScrubBatchInput(
                        tier=inp.tier,
                        node=batch.node,
                        replica_ids=batch.replica_ids,
                        stripe_ids=batch.stripe_ids,
                        bandwidth=0,
                        picked_at=READ_ALL,
                        actor="verify",
                    ),
                    inp.kind,
                )
                out.add(res)
            if not pick.more:
                return out
            after = pick.last_id
        workflow.continue_as_new(inp.model_copy(update={"after_id": after, "so_far": out}))
