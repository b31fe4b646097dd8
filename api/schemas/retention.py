"""Bodies of the dry-run and usage endpoints. The plan is the planner's own model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.policies import JobPolicy
from tierpoint.cost import summarise
from tierpoint.retention import RetentionPlan
from tierpoint.tier_config import TierConfig


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


class TierCostOut(BaseModel):
    tier: str
    price_per_gb_month: float = Field(description="US dollars per GB (2^30 bytes) and month")
    monthly_cost_now: float = Field(description="US dollars per month for the bytes there now")
    monthly_cost_after: float = Field(description="... once the planned expiries are done")


class CostOut(BaseModel):
    """Monthly storage cost in US dollars, from the catalog's bytes and the configured prices."""

    currency: Literal["USD"] = "USD"
    tiers: list[TierCostOut]
    monthly_cost_now: float
    monthly_cost_after: float

    @classmethod
    def of(cls, tiers: Sequence[TierConfig], plan: RetentionPlan) -> CostOut:
        summary = summarise(tiers, ((u.tier, u.bytes_now, u.bytes_after) for u in plan.usage))
        return cls(
            tiers=[TierCostOut(**dataclasses.asdict(t)) for t in summary.tiers],
            monthly_cost_now=summary.monthly_cost_now,
            monthly_cost_after=summary.monthly_cost_after,
        )


class CostComparison(BaseModel):
    """A previewed policy against the job's own, on the same snapshot of the catalog."""

    current_policy_monthly_cost_after: float = Field(
        description="monthly cost once the job's own policy's planned expiries are done"
    )
    monthly_cost_delta: float = Field(
        description="the preview's monthly cost after its expiries minus the current policy's: "
        "negative when the preview is cheaper"
    )


class DryRun(BaseModel):
    job: str
    policy: PolicyUsed
    plan: RetentionPlan
    cost: CostOut
    compared_to_current: CostComparison | None = Field(
        default=None, description="with a previewed `policy`: its cost against the job's policy"
    )


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
    price_per_gb_month: float = Field(description="US dollars per GB (2^30 bytes) and month")
    monthly_cost_now: float = Field(description="US dollars per month for bytes_now")
    monthly_cost_after: float = Field(description="US dollars per month for bytes_after")


class Usage(BaseModel):
    job: str
    now: datetime
    policy: JobPolicy
    tiers: list[TierUsageOut]
    currency: Literal["USD"] = "USD"
    monthly_cost_now: float = Field(description="the job's storage cost per month, all tiers")
    monthly_cost_after: float = Field(description="... once the planned expiries are done")
