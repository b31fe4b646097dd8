"""Body of the quarantine endpoint."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.tier_config import NAME_RE

MAX_REASON_CHARS = 1024


class Quarantine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: str = Field(
        min_length=1,
        max_length=MAX_REASON_CHARS,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Why it must not be restored from (shown in latest restorable's `skipped`).",
        examples=["loss is NaN right after loading"],
    )
    tier: str | None = Field(
        default=None,
        pattern=NAME_RE.pattern,
        description="Only this tier's copy; null or absent: the whole checkpoint.",
    )
