"""Responses of the operator actions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RetryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    step: int
    workflow_id: str = Field(description="the new lifecycle run")
    attempt: int = Field(description="1 for the checkpoint's first retry")
    tiers: list[str] = Field(description="the tiers that had failed and are pending again")
