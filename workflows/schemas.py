"""What the lifecycle workflow returns and answers to its `status` query."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TierOutcome(BaseModel):
    tier: str
    state: str
    reason: str | None = None


class LifecycleResult(BaseModel):
    checkpoint_id: int
    shard_count: int
    batches: int
    tiers: list[TierOutcome] = Field(default_factory=list)


class LifecycleStatus(BaseModel):
    # "starting", "plan", "seal:<tier>", "copy:<tier>", "promote:<tier>", "done"
    stage: str
    tiers_done: list[str] = Field(default_factory=list)
    tiers_failed: list[str] = Field(default_factory=list)
    batches_total: int = 0
    batches_done: int = 0  # of the current stage
