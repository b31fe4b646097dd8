"""What the operator reads return (`tierpoint.catalog.reads.operator`): plain dataclasses, named
`...View` like the other catalog reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class TierPointView:
    """A job's recovery point on one tier: what a restart restoring from it would get."""

    tier: str
    latest_step: int | None
    latest_created_at: datetime | None  # registration of that checkpoint
    restorable_at: datetime | None
    # how many steps / seconds of training a restart from this tier would repeat, measured
    # against the job's latest registered checkpoint and the database's now
    steps_behind: int | None
    age_seconds: float | None
    bytes: int  # restorable or expiring copies of the job on the tier
    checkpoints: int
    # latest_step's bytes over the read throughput recorded for the tier (None: no reads yet)
    predicted_restore_seconds: float | None = None


@dataclass
class JobOverviewView:
    job: str
    policy: str | None  # None: the job follows the default policy
    latest_step: int | None
    latest_created_at: datetime | None
    checkpoints: int
    in_flight: int  # checkpoints with a tier still pending
    failed: int  # checkpoints with a failed tier
    tiers: list[TierPointView]
    # Steps trained since the newest checkpoint restorable on the last tier (durable) and on any
    # tier, i.e. latest_step minus that checkpoint's step; None when there is none (every step
    # is at risk) or nothing is registered.
    steps_at_risk_durable: int | None = None
    steps_at_risk: int | None = None


@dataclass
class InFlightView:
    job: str
    step: int
    checkpoint_id: int
    tier: str
    created_at: datetime
    # when the copy to this tier could start: the previous tier's promotion, else registration
    started_at: datetime
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int
    elapsed_seconds: float
    bytes_per_second: float | None
    eta_seconds: float | None
    # the latest error a copy activity recorded on one of its replicas (a full tier, say)
    last_error: str | None = None


@dataclass
class LagView:
    job: str
    tier: str
    count: int
    p50_seconds: float
    p95_seconds: float
    max_seconds: float


@dataclass
class TierUsageRowView:
    tier: str
    job: str
    bytes: int
    checkpoints: int


@dataclass
class NodeView:
    id: str
    last_seen_at: datetime | None
    lost_at: datetime | None
    local_bytes: int  # verified local replicas on the node
    local_replicas: int
    failure_domain: str | None  # as its worker reported it; None: a domain of its own


@dataclass
class EventView:
    id: int
    kind: str
    tier: str | None
    actor: str | None
    detail: dict[str, object]
    created_at: datetime
