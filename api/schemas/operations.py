"""Responses of the operator views (`api/routers/operations.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _View(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TierPointOut(_View):
    tier: str
    latest_step: int | None = Field(description="latest restorable step on the tier (none: never)")
    latest_created_at: datetime | None = Field(description="when that checkpoint was registered")
    restorable_at: datetime | None = Field(description="when it became restorable on the tier")
    steps_behind: int | None = Field(
        description="recovery point in steps: the job's latest registered step minus latest_step"
    )
    age_seconds: float | None = Field(
        description="recovery point in time: now minus latest_created_at (training a restart "
        "from this tier repeats)"
    )
    bytes: int = Field(description="bytes of the job's copies held on the tier")
    checkpoints: int
    monthly_cost: float = Field(description="US dollars per month for those bytes (cost.md)")
    predicted_restore_seconds: float | None = Field(
        description="restoring latest_step from this tier: its bytes over the read throughput "
        "recorded for the tier (verifications read whole copies back); none: no reads recorded"
    )


class JobOverviewOut(_View):
    job: str
    policy: str | None = Field(description="the assigned policy; none: the default applies")
    latest_step: int | None
    latest_created_at: datetime | None
    checkpoints: int
    in_flight: int = Field(description="checkpoints with a tier copy still pending")
    failed: int = Field(description="checkpoints with a failed tier copy")
    monthly_cost: float = Field(description="US dollars per month, all tiers")
    tiers: list[TierPointOut]
    steps_at_risk_durable: int | None = Field(
        description="steps trained since the newest checkpoint restorable on the last tier: "
        "latest_step minus its step (none: nothing is restorable there, every step is at risk)"
    )
    steps_at_risk: int | None = Field(
        description="steps trained since the newest checkpoint restorable on any tier: "
        "latest_step minus its step (none: nothing is restorable, every step is at risk)"
    )


class JobsOverviewPage(BaseModel):
    now: datetime
    total: int = Field(description="jobs matching the filters, on every page")
    items: list[JobOverviewOut]
    next_cursor: str | None


class InFlightOut(_View):
    job: str
    step: int
    checkpoint_id: int
    tier: str
    created_at: datetime
    started_at: datetime = Field(
        description="when the copy to this tier could start: the faster tier's promotion, else "
        "registration"
    )
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int
    elapsed_seconds: float
    bytes_per_second: float | None = Field(description="bytes_done / elapsed (none: no bytes yet)")
    eta_seconds: float | None
    last_error: str | None = Field(
        default=None,
        description="why the copy is stuck, if an attempt failed (e.g. the tier is full): the "
        "latest error recorded on one of its replicas",
    )


class InFlightList(BaseModel):
    now: datetime
    total: int = Field(description="copies in flight matching the filters, listed or not")
    items: list[InFlightOut]


class RetryRefusalOut(_View):
    code: str = Field(description="the problem code a retry is refused with (api.md)")
    detail: str = Field(description="the problem's detail, as a retry answers it")
    why: str = Field(description="the detail's own clause, without the failure's reason")


class FailureOut(_View):
    job: str
    step: int
    checkpoint_id: int
    tier: str
    reason: str | None
    failed_at: datetime
    last_error: str | None = Field(
        description="the most recent replica error on the tier; none when the reason says it "
        "already (a node declared lost, a reconciliation)"
    )
    retryable: bool = Field(
        description="whether a retry (POST .../retry) could help: false where a run could only "
        "be refused, with retry_refused saying why"
    )
    retry_refused: RetryRefusalOut | None = Field(
        description="why no retry can help (none: it can): `no_verified_source` (the copies a "
        "run would start from are gone), `copy_on_lost_node` (the copy was on a node declared "
        "lost), `repair_in_progress` (a repair is copying it back and promotes it when done)"
    )


class FailurePage(BaseModel):
    now: datetime
    total: int = Field(description="open failures matching the filters, on every page")
    items: list[FailureOut]
    next_cursor: str | None


class LagOut(_View):
    job: str
    tier: str
    count: int = Field(description="copies promoted within the window")
    p50_seconds: float
    p95_seconds: float
    max_seconds: float


class LagList(BaseModel):
    now: datetime
    window_seconds: float
    items: list[LagOut]


class JobUsageOut(BaseModel):
    job: str
    bytes: int
    checkpoints: int


class TierUsageSummaryOut(BaseModel):
    tier: str
    kind: str
    code: str | None = Field(
        default=None, description="a coded peer tier's code, e.g. `rs(8,2)`; null otherwise"
    )
    bytes: int = Field(description="bytes of copies held, all jobs (from the catalog)")
    held_bytes: int = Field(
        description="bytes the tier holds for them: `bytes` x (k+m)/k on a coded peer tier (its "
        "stripes), `bytes` elsewhere; what `monthly_cost` prices"
    )
    checkpoints: int
    monthly_cost: float
    free_bytes: int | None = Field(
        description="POSIX tiers seen by the API process: free space of the file system; "
        "none for S3, node-local tiers and roots this process cannot see"
    )
    capacity_bytes: int | None
    jobs: list[JobUsageOut] = Field(description="the jobs holding the most bytes, largest first")


class TierUsageList(BaseModel):
    items: list[TierUsageSummaryOut]


class NodeOut(_View):
    id: str
    last_seen_at: datetime | None
    lost_at: datetime | None
    local_bytes: int = Field(description="bytes of verified local replicas on the node")
    local_replicas: int
    failure_domain: str | None = Field(
        description="what fails together with the node (a rack, a zone), as its worker reported "
        "it with its heartbeat (`failure_domain` setting); null: a domain of its own. Peer "
        "placement keeps a node's copies out of its domain."
    )


class NodeList(BaseModel):
    items: list[NodeOut]


class EventOut(_View):
    id: int
    kind: str
    tier: str | None
    actor: str | None
    detail: dict[str, Any]
    created_at: datetime


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None
