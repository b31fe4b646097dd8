"""Re-replication of peer copies: `PeerRereplicate` (one run per checkpoint and node loss, id
`checkpoint/<job>/<step>/peer-replicas`, `<step>.b<N>` on later branches) copies again, to new
holders, the peer copies that a lost node held, and promotes the peer tiers again. The copies
are the lifecycle's own (`lifecycle.copy_batch` on each new holder's queue) and so is the
promotion (`lifecycle.promote`).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from tierpoint.contract.common import backoff
from tierpoint.contract.lifecycle import Batch, PlanTier, checkpoint_key

REREPLICATE_WORKFLOW = "PeerRereplicate"
# Plan again once the copies under way ended: nodes a failed peer copy could not use may be free
# (another peer copy of the checkpoint expired on them).
REPLAN_SIGNAL = "replan"
PLAN = "peer.plan"
PLAN_TIMEOUT = timedelta(seconds=30)
PLAN_RETRY = backoff(timedelta(minutes=1), 0)


def rereplicate_id(job: str, step: int, branch: int = 1) -> str:
    return f"checkpoint/{checkpoint_key(job, step, branch)}/peer-replicas"


class RereplicateInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int


class PeerStage(BaseModel):
    """One peer tier's copies to make again, onto each batch's new holder: from `source` (the
    local tier before it) on the shards' nodes, or, where that copy is gone (its node lost, the
    copy expired), from the fastest other copy verified on a node not lost (`Batch.source_tier`,
    `Batch.source_node`): another peer tier's holder, the shared tier, S3."""

    tier: PlanTier
    source: PlanTier
    batches: list[Batch]
    # Shards that cannot be copied again (no other tier holds them verified on a node not lost),
    # for the reason.
    unreachable: int = 0
    # Source nodes with no serving node to hold the copy apart from themselves and the holders of
    # their other copies: not copied (never beside another copy), for the reason. Empty in
    # histories recorded before.
    unplaced: list[str] = Field(default_factory=list)


class PeerPlan(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    stages: list[PeerStage] = Field(default_factory=list)
    lost_nodes: list[str] = Field(default_factory=list)
    batch_heartbeat_seconds: float = 60.0
