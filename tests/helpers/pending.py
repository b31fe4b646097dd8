"""The pending copy batch of a lifecycle as the Temporal server knows it: its attempt and state,
its last heartbeat (details, and when it arrived) and the failure of its previous attempt. The
fault tests wait on it to catch a copy mid-way (a heartbeat with a byte offset is a resume point)
and to see it retried."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tierpoint.contract.lifecycle import COPY_BATCH


@dataclass(frozen=True)
class PendingCopy:
    attempt: int  # 0: no copy batch is pending
    state: int  # a temporalio PendingActivityState
    # The details of the last heartbeat the server holds (a byte offset, an upload id).
    details: dict[str, Any] = field(default_factory=dict)
    # When the server last received a heartbeat (seconds since the epoch, 0 if never).
    heartbeat_at: float = 0.0
    # The failure of the previous attempt ("" on the first attempt).
    last_failure: str = ""

    @property
    def offset(self) -> int:
        """The byte offset of the last heartbeat: where a retry resumes."""
        return int(self.details.get("offset") or 0)


NO_COPY = PendingCopy(0, 0)


async def pending_copy(
    client: Client, handle: WorkflowHandle[Any, Any], tier: str | None = None
) -> PendingCopy:
    """The workflow's pending copy batch (to `tier`: the one whose last heartbeat names it, as the
    copies of a checkpoint run at once), NO_COPY when none is pending."""
    desc = await handle.describe()
    for pa in desc.raw_description.pending_activities:
        if pa.activity_type.name != COPY_BATCH:
            continue
        details: dict[str, Any] = {}
        if pa.heartbeat_details.payloads:
            decoded = await client.data_converter.decode(pa.heartbeat_details.payloads)
            if decoded and isinstance(decoded[-1], dict):
                details = decoded[-1]
        if tier is not None and details.get("tier") != tier:
            continue
        at = 0.0
        if pa.HasField("last_heartbeat_time"):
            at = pa.last_heartbeat_time.ToDatetime().timestamp()
        failure = ""
        if pa.HasField("last_failure"):
            # The server keeps a long retryable failure (a stack trace) as the cause of a
            # "Failure exceeds size limit." of its own.
            last = pa.last_failure
            failure = last.cause.message or last.message
        return PendingCopy(pa.attempt, int(pa.state), details, at, failure)
    return NO_COPY
