"""Retention: which copies of a job's checkpoints stay on which tier, decided by a pure planner."""

from .models import (
    CheckpointInfo,
    Expiry,
    ExpiryRule,
    Keep,
    KeepReason,
    RetentionPlan,
    RetentionSnapshot,
    TierCopy,
    TierUsage,
    Unfinished,
)
from .planner import plan
from .policy import (
    DEFAULT_POLICY,
    KeepEvery,
    Policy,
    PolicyProblem,
    TierRef,
    TierRule,
    check_tiers,
    promotion_targets,
    tier_refs,
)

__all__ = [
    "DEFAULT_POLICY",
    "CheckpointInfo",
    "Expiry",
    "ExpiryRule",
    "Keep",
    "KeepEvery",
    "KeepReason",
    "Policy",
    "PolicyProblem",
    "RetentionPlan",
    "RetentionSnapshot",
    "TierCopy",
    "TierRef",
    "TierRule",
    "TierUsage",
    "Unfinished",
    "check_tiers",
    "plan",
    "promotion_targets",
    "tier_refs",
]
