from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    created_at: datetime
    checkpoint_count: int = Field(description="every checkpoint registered, superseded included")
    latest_step: int | None = Field(
        description="the newest step on the job's timeline (a rollback's superseded steps are "
        "not counted); none: nothing registered"
    )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class JobAccess(BaseModel):
    """What the calling token may do with one job: a client checks before it writes a byte."""

    # Named `register` on the wire; `register_` here, since BaseModel has a `register` of its
    # own (a field by that name shadowed it, and the schema took the method for its default).
    model_config = ConfigDict(populate_by_name=True)

    job: str
    token: str
    read: bool
    register_: bool = Field(alias="register")
    lease: bool
