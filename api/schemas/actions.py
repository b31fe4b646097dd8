"""Responses of the operator actions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.json_types import Text, Timestamp

# Failures listed in the answer of an acknowledgement by job or reason (all are counted).
ACKNOWLEDGED_SHOWN = 100


class RetryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    step: int
    workflow_id: str = Field(description="the new lifecycle run")
    attempt: int = Field(description="1 for the checkpoint's first retry")
    tiers: list[str] = Field(description="the tiers that had failed and are pending again")


class VerifyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tier: Text = Field(min_length=1, max_length=128, description="the tier whose copy to read back")


class VerifyOutcomeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    read: int = Field(description="replicas read back")
    good: int = Field(description="read back with the registered size and crc32c")
    corrupt: int = Field(description="read back wrong: marked corrupt, the tier demoted")
    lost: int = Field(description="not there: marked lost, the tier demoted")
    skipped: int = Field(description="no longer verified when their turn came")
    bytes: int = Field(description="bytes of the good replicas")
    repair_requested: bool = Field(description="a repair run was asked for the damage found")
    problems: list[str] = Field(description="a few of the problems found")


class VerifyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    step: int
    tier: str
    workflow_id: str = Field(description="the verification workflow (one per checkpoint and tier)")
    run_id: str | None = Field(description="its run: ask again while it runs and you join it")
    joined: bool = Field(description="a verification of this copy was already running")
    status: str = Field(description="running, completed or failed")
    outcome: VerifyOutcomeOut | None = Field(description="what it read, once completed")
    error: str | None = None


class AcknowledgeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tier: Text | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="only the failure on this tier (omitted: every failed tier of the checkpoint)",
    )


class AcknowledgeOut(BaseModel):
    job: str
    step: int
    acknowledged: dict[str, str | None] = Field(
        description="the failures acknowledged: tier -> the reason it failed"
    )


class AcknowledgeMatchingIn(BaseModel):
    """Which open failures to acknowledge: those of a job, those whose reason contains some
    text, or both (at least one of the two)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: Text | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="the job's failures (its exact name)",
    )
    reason: Text | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="failures whose reason contains this text, in any case (e.g. `lost on s3`)",
    )
    tier: Text | None = Field(
        default=None, min_length=1, max_length=128, description="on this tier"
    )
    until: Timestamp | None = Field(
        default=None,
        description="only failures that failed at or before this time: give the `now` of the "
        "failures list you decided on, and a failure that came after stays on the list",
    )


class AcknowledgedOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    step: int
    tier: str
    reason: str | None


class AcknowledgeMatchingOut(BaseModel):
    acknowledged: int = Field(description="how many failures were acknowledged")
    items: list[AcknowledgedOut] = Field(
        description=f"the first {ACKNOWLEDGED_SHOWN} of them, oldest checkpoint first"
    )


class DeletedCheckpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step: int
    tiers: list[str] = Field(description="the copies sent to expiry (their bytes go next)")
    overrode: list[str] = Field(
        description="what protected it and was overridden with force: pinned, leased, in flight"
    )


class DeletionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job: str
    deleted: list[DeletedCheckpointOut]
    already_deleted: list[int] = Field(description="steps deleted earlier: nothing more to do")
