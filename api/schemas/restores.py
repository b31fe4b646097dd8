"""Bodies of the restore endpoint: what a restarting job asks once, and the one answer that says
which step, from where, under which lease."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.checkpoints import CheckpointDetailOut, SkippedOut
from api.schemas.leases import Lease, TtlSeconds
from api.schemas.tiers import TierOut
from tierpoint.json_types import JsonInt, Text
from tierpoint.manifest import StepInt

_NAME = r"^[^\x00-\x1f\x7f]+$"


class StartRestore(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    step: StepInt | None = Field(
        default=None, description="The step to restore; absent: the latest restorable one."
    )
    tier: Text | None = Field(
        default=None,
        description="Without `step`: choose the latest step restorable from this tier.",
    )
    node: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=_NAME,
        description="Without `step`: the caller's node, whose node-local copies then count.",
    )
    ttl_seconds: JsonInt = TtlSeconds
    holder: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=_NAME,
        description="Who holds the lease (free text, e.g. the restarting job and its size).",
    )


class RestoreOut(BaseModel):
    job: str
    step: int
    lease: Lease = Field(description="held on the step until released or expired")
    checkpoint: CheckpointDetailOut = Field(
        description="the step with every shard and every copy of it: where each file can be read"
    )
    tiers: list[TierOut] = Field(description="the configured tiers, fastest first")
    skipped: list[SkippedOut] = Field(
        description="without `step`: every newer step, and why it was not chosen"
    )
