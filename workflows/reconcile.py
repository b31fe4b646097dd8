"""Reconcile: compare the catalog with what each tier really holds, one scan activity per tier
(and node, for a local tier, on that node's queue), and with `repair` ask for the repair of every
checkpoint a scan marked damaged. The result is the report; `status` answers with the part done.

Deterministic: no I/O; the history holds one plan, one scan per unit and the repair requests
(units are tiers x serving nodes: a stack of thousands of nodes runs one Reconcile per tier).
"""

from __future__ import annotations

import asyncio

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
        NODE_QUEUE_WAIT,
        READ_HEARTBEAT,
        READ_RETRY,
        READ_TIMEOUT,
        RECONCILE_PLAN,
        RECONCILE_SCAN,
        RECONCILE_WORKFLOW,
        REPAIR_REQUEST,
        ReconcileInput,
        ReconcilePlan,
        ReconcileReport,
        ReconcileScanInput,
        ReconcileUnit,
        RepairStartInput,
        TierReport,
    )

# Scans at once (each lists one tier or one node's local root).
SCAN_WINDOW = 8


@workflow.defn(name=RECONCILE_WORKFLOW)
class Reconcile:
    def __init__(self) -> None:
        self._report = ReconcileReport()

    @workflow.query
    def status(self) -> ReconcileReport:
        return self._report

    @workflow.run
    async def run(self, inp: ReconcileInput) -> ReconcileReport:
        self._report = ReconcileReport(tier=inp.tier, job=inp.job, repair=inp.repair)
        plan: ReconcilePlan = await workflow.execute_activity(
            RECONCILE_PLAN,
            inp,
            result_type=ReconcilePlan,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        window = asyncio.Semaphore(SCAN_WINDOW)

        async def one(unit: ReconcileUnit) -> TierReport:
            async with window:
                try:
                    res: TierReport = await workflow.execute_activity(
                        RECONCILE_SCAN,
                        ReconcileScanInput(
                            unit=unit,
                            job=inp.job,
                            repair=inp.repair,
                            grace_seconds=plan.grace_seconds,
                        ),
                        result_type=TierReport,
                        task_queue=node_task_queue(unit.node) if unit.node else SHARED_TASK_QUEUE,
                        schedule_to_start_timeout=NODE_QUEUE_WAIT if unit.node else None,
                        start_to_close_timeout=READ_TIMEOUT,
                        heartbeat_timeout=READ_HEARTBEAT,
                        retry_policy=READ_RETRY,
                    )
                except ActivityError as err:
                    res = TierReport(tier=unit.tier, node=unit.node, error=error_message(err))
                self._report.tiers.append(res)
                return res

        reports = await asyncio.gather(*(one(u) for u in plan.units))
        damaged = sorted({cid for r in reports for cid in r.damaged})
        if damaged:
            await workflow.execute_activity(
                REPAIR_REQUEST,
                RepairStartInput(checkpoint_ids=damaged, reason="reconcile found damage"),
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        # Report order does not depend on which scan finished first.
        self._report.tiers = sorted(reports, key=lambda r: (r.tier, r.node or ""))
        self._report.repairs_requested = len(damaged)
        return self._report
