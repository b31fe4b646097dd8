"""What the lifecycle workflow returns and answers to its `status` query."""

from __future__ import annotations

from pydantic import BaseModel, Field

from activities.schemas import Batch, PlanTier


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


class StageInput(BaseModel):
    """One slice of a stage's batches, run by a child workflow when a stage has too many
    batches for one history (e.g. a checkpoint spread over thousands of nodes)."""

    checkpoint_id: int
    job: str
    step: int
    tier: PlanTier
    source: PlanTier | None = None  # None: seal `tier`; else copy source -> tier
    batches: list[Batch]
    # Plan.batch_heartbeat_seconds; the default is what earlier histories ran with.
    batch_heartbeat_seconds: float = 60.0


class StageResult(BaseModel):
    batches: int
    failures: int = 0
    first_failure: str | None = None
