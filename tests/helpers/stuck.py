"""What a stack that stopped making progress is doing, said in the failure it raises: a
lifecycle as the Temporal server knows it, and where this process's threads are inside the
project's code. A timeout that only says "still pending" leaves a failure on a busy CI machine
without a cause."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from tierpoint.contract.lifecycle import workflow_id

ROOT = Path(__file__).resolve().parents[2]
_OWN = tuple(str(ROOT / d) + "/" for d in ("tierpoint", "activities", "workflows", "api", "apps"))
_FAILED_TASKS = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
)


async def lifecycle_report(client: Client, job: str, step: int, branch: int = 1) -> str:
    """One line: the lifecycle's status, its pending activities (attempt, last failure) and the
    workflow tasks that failed or timed out (the last one's cause)."""
    wid = workflow_id(job, step, branch)
    handle = client.get_workflow_handle(wid)
    try:
        desc = await handle.describe()
    except RPCError as e:
        return f"{wid}: {e.message}"
    status = desc.status.name if isinstance(desc.status, WorkflowExecutionStatus) else "?"
    parts = [f"{wid} {status}, {desc.history_length} events"]
    for pa in desc.raw_description.pending_activities:
        failure = ""
        if pa.HasField("last_failure"):
            failure = f", last failure: {pa.last_failure.cause.message or pa.last_failure.message}"
        parts.append(f"pending {pa.activity_type.name} attempt {pa.attempt}{failure}")
    failed = [e async for e in handle.fetch_history_events() if e.event_type in _FAILED_TASKS]
    if failed:
        last = failed[-1]
        cause = (
            last.workflow_task_failed_event_attributes.failure.message
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            else "timed out"
        )
        parts.append(f"{len(failed)} workflow tasks failed, the last: {cause}")
    return "; ".join(parts)


def busy_threads() -> str:
    """One line: each thread of this process that is inside the project's code, and where (its
    innermost frame there); idle pool threads are left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    busy = []
    for ident, frame in sys._current_frames().items():
        f: FrameType | None = frame
        while f is not None and not f.f_code.co_filename.startswith(_OWN):
            f = f.f_back
        if f is None:
            continue
        where = Path(f.f_code.co_filename).relative_to(ROOT)
        # The innermost frame of all says what it waits on (a socket, a lock).
        busy.append(
            f"{names.get(ident, ident)}: {where}:{f.f_lineno} {f.f_code.co_name}"
            f" -> {frame.f_code.co_name}"
        )
    return "; ".join(busy) or "no thread in the project's code"
