"""Bodies of the dry-run and usage endpoints. The plan is the planner's own model."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.policies import JobPolicy
from tierpoint.retention import RetentionPlan


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    policy: dict[str, Any] | None = Field(
        default=None,
        description="Preview this policy document instead of the job's policy (nothing is stored).",
    )


class PolicyUsed(BaseModel):
    source: str = Field(description="job, default, builtin, or preview")
    name: str | None
    version: int | None
    spec: dict[str, Any]


class DryRun(BaseModel):
    job: str
    policy: PolicyUsed
    plan: RetentionPlan


class TierUsageOut(BaseModel):
    tier: str
    kind: str
    bytes_now: int = Field(description="bytes of the job's copies on the tier now")
    bytes_after: int = Field(description="bytes once the planned expiries are done")
    checkpoints_now: int = Field(description="checkpoints restorable from the tier now")
    checkpoints_after: int = Field(description="checkpoints restorable after the planned expiries")
    expiring: int = Field(description="checkpoints planned to expire or already being deleted")
    max_bytes: int | None
    quota_met: bool | None
    over_by: int


class Usage(BaseModel):
    job: str
    now: datetime
    policy: JobPolicy
    tiers: list[TierUsageOut]
