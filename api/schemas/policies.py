"""Request and response bodies of the retention policy endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.catalog.policy.assigned import AssignedPolicy
from tierpoint.tier_config import NAME_RE

POLICY_NAME_PATTERN = NAME_RE.pattern


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreatePolicy(_In):
    name: str = Field(pattern=POLICY_NAME_PATTERN, examples=["llama-70b"])
    # Validated by hand against Policy (422 `invalid_policy`, field paths under `spec`), so a bad
    # document is told apart from a bad request.
    spec: dict[str, Any] = Field(
        description="The policy document (see docs/retention.md).",
        examples=[{"format": 1, "kinds": {"local": {"keep_last": 2}}}],
    )
    default: bool = Field(
        default=False, description="Make it the default policy (jobs without their own)."
    )


class UpdatePolicy(_In):
    spec: dict[str, Any] = Field(
        description="The new policy document; a different one is a new version."
    )
    default: bool | None = Field(
        default=None, description="true/false: make it (no longer) the default; absent: unchanged"
    )


class PolicyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    version: int = Field(description="revision of this policy, bumped on every new document")
    spec: dict[str, Any]
    default: bool
    jobs: int = Field(description="jobs assigned to this policy by name")
    created_at: datetime | None = Field(description="none for the built-in policy")
    updated_at: datetime | None = Field(description="none for the built-in policy")


class PolicyList(BaseModel):
    items: list[PolicyOut]


class PolicyChangeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str | None
    job: str | None
    detail: dict[str, Any] = Field(
        description="action (created, revised, default_set, default_unset, assigned, deleted), "
        "policy, version, and for documents old_spec / new_spec"
    )


class PolicyHistory(BaseModel):
    name: str
    items: list[PolicyChangeOut]


class AssignPolicy(_In):
    policy: str | None = Field(
        pattern=POLICY_NAME_PATTERN,
        description="Policy name; null: the job follows the default policy.",
    )


class JobPolicy(BaseModel):
    job: str
    source: Literal["job", "default", "builtin"] = Field(
        description="job: assigned to the job; default: the catalog's default policy; builtin: "
        "no default policy in the catalog, the built-in one applies"
    )
    name: str
    version: int
    spec: dict[str, Any]

    @classmethod
    def of(cls, job: str, assigned: AssignedPolicy) -> JobPolicy:
        return cls(
            job=job,
            source=assigned.source,
            name=assigned.name,
            version=assigned.version,
            spec=assigned.policy.to_spec(),
        )
