"""Starting a reconciliation and reading its report, for the API (and through it the CLI).

A run lists whole tiers, which takes minutes on a large bucket: longer than an HTTP request should
wait. So a run is a `Reconcile` workflow; the request answers with its id at once and the report
is read from the workflow (its `status` query while it runs, its result after).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from tierpoint.contract.integrity import RECONCILE_WORKFLOW, ReconcileInput, ReconcileReport
from tierpoint.errors import ReconcileNotFound
from tierpoint.temporal import start_reconcile

QUERY_TIMEOUT = timedelta(seconds=5)


async def start(client: Client, inp: ReconcileInput) -> str:
    run_id = uuid.uuid4().hex
    await start_reconcile(client, inp, run_id)
    return run_id


async def status(client: Client, run_id: str) -> dict[str, Any]:
    handle = client.get_workflow_handle(f"reconcile/{run_id}", result_type=ReconcileReport)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise ReconcileNotFound(f"no reconciliation run {run_id!r}") from None
        raise
    if desc.workflow_type != RECONCILE_WORKFLOW:
        raise ReconcileNotFound(f"no reconciliation run {run_id!r}")
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        report = await handle.result()
        return {"id": run_id, "status": "completed", "report": report.model_dump(mode="json")}
    if desc.status == WorkflowExecutionStatus.RUNNING:
        # A query needs a worker to answer it: without one, say "running" rather than hang.
        try:
            report = await handle.query(
                "status", result_type=ReconcileReport, rpc_timeout=QUERY_TIMEOUT
            )
        except (RPCError, WorkflowQueryFailedError):
            return {"id": run_id, "status": "running", "report": None}
        return {"id": run_id, "status": "running", "report": report.model_dump(mode="json")}
    name = desc.status.name.lower() if desc.status is not None else "unknown"
    return {"id": run_id, "status": name, "report": None}
