"""What catalog reads return: plain dataclasses, named `...View`, so that they are told apart from
the ORM rows (`tierpoint.catalog.models`), the API's response schemas and the client's models."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tierpoint.catalog.holds.leases import LeaseView
from tierpoint.catalog.stripe.coverage import CodedCoverage


@dataclass
class ProgressView:
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int


@dataclass
class TierView:
    tier: str
    kind: str | None  # None for a tier copy of a tier no longer configured
    state: str
    reason: str | None
    quarantine_reason: str | None
    restorable_at: datetime | None
    progress: ProgressView
    # a coded peer tier's copy: its sets' standing (None on other tiers)
    coverage: CodedCoverage | None = None


@dataclass(frozen=True)
class CheckpointRefView:
    id: int
    job: str
    step: int
    branch: int


@dataclass(frozen=True)
class HealthView:
    verdict: str
    metric: str | None
    value: float | None
    at_step: int | None
    detail: str | None
    by: str | None
    at: datetime


@dataclass
class CheckpointView:
    id: int
    job: str
    step: int
    created_at: datetime
    metadata: dict[str, Any]
    pinned: bool
    quarantine_reason: str | None
    total_bytes: int
    shard_count: int
    workflow_started: bool
    tiers: list[TierView]
    deleted_at: datetime | None = None  # an admin deleted it: its copies expire
    branch: int = 1
    superseded_by: int | None = None
    health: HealthView | None = None
    parent: CheckpointRefView | None = None
    provenance: dict[str, Any] | None = None


@dataclass
class ReplicaView:
    tier: str
    node: str | None
    state: str
    location: str
    bytes_done: int
    verified_at: datetime | None
    error: str | None
    # when a scrub (or a re-verification after a report) last read it back good
    scrubbed_at: datetime | None = None
    # S3 copies: the object, as data (`location` is for display only)
    bucket: str | None = None
    key: str | None = None
    # Peer copies: the holder's data endpoint URL of this file
    url: str | None = None
    # A coded peer copy: its code ("rs(k,m)") and the stripes a restore may read, any k of which
    # give the file back (`size` and `crc32c` above are the file's)
    code: str | None = None
    stripes: list[PlanStripe] | None = None


@dataclass
class ShardView:
    path: str
    size: int
    crc32c: str | None
    node: str
    replicas: list[ReplicaView] = field(default_factory=list)


@dataclass
class CheckpointDetailView(CheckpointView):
    shards: list[ShardView] = field(default_factory=list)


@dataclass
class JobView:
    name: str
    created_at: datetime
    checkpoint_count: int
    latest_step: int | None


@dataclass(frozen=True)
class PlanStripe:
    """A stripe of a coded copy a restore may read: verified on `node`, served at `url`."""

    index: int
    node: str
    url: str
    size: int
    crc32c: str


@dataclass
class RestorePlanEntry:
    path: str
    size: int
    crc32c: str | None
    tier: str
    kind: str
    node: str | None
    location: str
    # S3 copies: the object, as data (`location` is for display only)
    bucket: str | None = None
    key: str | None = None
    # Peer copies: the holder's data endpoint URL of this file
    url: str | None = None
    # A coded peer copy: its code ("rs(k,m)") and the stripes a restore may read, any k of which
    # give the file back (`size` and `crc32c` above are the file's)
    code: str | None = None
    stripes: list[PlanStripe] | None = None


@dataclass
class SkippedStep:
    step: int
    reasons: list[str]


@dataclass
class LatestRestorableView:
    job: str
    step: int
    checkpoint: CheckpointView
    plan: list[RestorePlanEntry]
    skipped: list[SkippedStep]
    lease: LeaseView | None = None
    # The job has no restorable checkpoint of its own: this is its fork parent's (of `job`).
    fork_parent: bool = False
