"""Bodies of the restore lease and pin endpoints."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.checkpoints import LatestRestorableOut
from tierpoint.catalog.holds.leases import MAX_LEASE_SECONDS
from tierpoint.json_types import JsonInt

TtlSeconds = Field(ge=1, le=MAX_LEASE_SECONDS, description="Lease duration in seconds.")


class CreateLease(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ttl_seconds: JsonInt = TtlSeconds
    # The wire keeps the field's first name, `holder`.
    owner: str | None = Field(
        default=None,
        validation_alias="holder",
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Who takes it (free text, e.g. the restarting job's node).",
    )


class RenewLease(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ttl_seconds: JsonInt = TtlSeconds


class Lease(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job: str
    step: int
    owner: str | None = Field(serialization_alias="holder", description="Who took it.")
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None
    active: bool = Field(description="unreleased and not expired: the checkpoint cannot expire")


class LeaseList(BaseModel):
    items: list[Lease]
    next_cursor: str | None = Field(
        default=None, description="the next page's `cursor`; null on the last page"
    )


class Pin(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    step: int
    pinned: bool
    changed: bool = Field(description="false when it already was (un)pinned")


class LatestWithLease(LatestRestorableOut):
    lease: Lease | None = Field(
        default=None, description="the lease taken with the answer when lease_ttl was given"
    )
