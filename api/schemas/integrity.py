"""Request and response schemas of the integrity endpoints: scrub totals, reconciliation runs,
reports of corrupt copies."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.json_types import Text


class TierScrubOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    tier: str
    bandwidth: int = Field(description="bytes/s the scrub reads from this tier (0: not scrubbed)")
    replicas: int = Field(description="replicas read back good by scrubs, in total")
    stripes: int = Field(
        default=0,
        description="stripes of a coded peer tier read back good on their holders, in total "
        "(on a coded tier `corrupt` and `lost` count stripes)",
    )
    bytes: int = Field(description="bytes those reads covered")
    corrupt: int = Field(description="replicas a scrub found corrupt")
    lost: int = Field(description="replicas a scrub found missing")
    last_scrubbed_at: datetime | None
    oldest_read_at: datetime | None = Field(
        description="the last verification or scrub of the verified replica read longest ago"
    )


class ScrubOut(BaseModel):
    enabled: bool
    interval_seconds: float
    min_age_seconds: float
    tiers: list[TierScrubOut]


class ReconcileIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tier: Text | None = Field(default=None, description="only this tier (default: every tier)")
    job: Text | None = Field(default=None, description="only this job (default: every job)")
    repair: bool = Field(
        default=False,
        description="mark missing/wrong-sized replicas lost/corrupt, demote their tiers, start "
        "repairs, and remove abandoned temp files and multipart uploads",
    )


class ReconcileRunOut(BaseModel):
    id: str
    status: str = Field(description="running, completed, failed, terminated, ...")
    report: dict[str, Any] | None = None


class CorruptCopyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tier: Text = Field(min_length=1, max_length=128)
    path: Text = Field(min_length=1, max_length=4096, description="the shard's registered path")
    reason: Text = Field(min_length=1, max_length=1000)
    stripe: int | None = Field(
        default=None,
        ge=0,
        lt=32,
        description="on a coded peer tier: the index of the stripe of the shard's set whose "
        "bytes did not match its crc32c (the plan's `stripes[].index`); its holder reads it back",
    )


class CorruptCopyOut(BaseModel):
    replica_state: str | None = Field(
        description="the replica's state now (a reported stripe's: the stripe's)"
    )
    # The wire keeps the field's first name (clients read it).
    tier_copy_state: str | None = Field(serialization_alias="marker_state")
    repair: str = Field(description="started | no verified source | running | pending | not needed")
    verification: str = Field(
        description="confirmed | not confirmed | running | recently read back good | "
        "already <state>"
    )
