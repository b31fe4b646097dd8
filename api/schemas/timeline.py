"""Request and response schemas of a run's timeline: rollbacks and branches, forks, lineage and
health verdicts (docs/timeline.md says what each means; docs/api.md the routes)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.manifest import MAX_BRANCH, ParentRef, Provenance, StepInt

MAX_REASON_CHARS = 1024
_TEXT = r"^[^\x00-\x1f\x7f]+$"


class Verdict(StrEnum):
    """A checkpoint's training health: `good` (training went on healthily from it), `suspect`
    (kept out of `latest?health=good`, nothing else), `bad` (quarantined: never restored)."""

    GOOD = "good"
    SUSPECT = "suspect"
    BAD = "bad"


__all__ = ["CheckpointRefIn", "Provenance"]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class RollbackIn(_In):
    step: StepInt = Field(description="The step to go back to: the new branch starts from it.")
    from_branch: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BRANCH,
        description="The branch the caller believes is current (what it loaded). When another "
        "rollback has changed it since: 409 `rollback_conflict` naming the winner. Clients send "
        "it; without it only a racing rollback to the same step by another caller is refused.",
    )
    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REASON_CHARS,
        pattern=_TEXT,
        examples=["loss spike at step 1230; data order reshuffled"],
    )


class BranchOut(_Out):
    number: int = Field(description="1 for a job's first branch; each rollback adds one")
    parent: int | None = Field(description="the branch it was rolled back from; null for 1")
    from_step: int | None = Field(description="the step it starts from; null for branch 1")
    from_checkpoint_id: int | None
    created_at: datetime
    created_by: str | None = Field(description="the token that rolled back")
    reason: str | None
    current: bool = Field(description="new checkpoints of the job are saved on it")
    step_dir: str = Field(
        description="how this branch names a step's directory on every tier, with `{step}` for "
        "the step: `{step}` on branch 1 (as before branches), `{step}.b<branch>` on later ones, "
        "so a re-saved step never shares a file with the one it supersedes"
    )


class RollbackOut(_Out):
    job: str
    created: bool = Field(description="false: a retry of the rollback that made this branch")
    branch: BranchOut
    superseded: list[int] = Field(
        description="the steps this rollback superseded (still listed and restorable by "
        "branch, never latest); empty on a retry"
    )


class BranchesOut(_Out):
    job: str
    current: int
    items: list[BranchOut]


CheckpointRefIn = ParentRef


class CheckpointRefOut(_Out):
    id: int
    job: str
    step: int
    branch: int


class ForkIn(_In):
    parent: CheckpointRefIn = Field(
        description="The checkpoint of another job the new job starts from."
    )


class ForkOut(_Out):
    job: str
    created: bool = Field(description="false: the same fork again")
    parent: CheckpointRefOut
    created_at: datetime
    created_by: str | None


class HealthOut(_Out):
    model_config = ConfigDict(from_attributes=True, ser_json_inf_nan="strings")

    verdict: Verdict
    metric: str | None
    value: float | None
    at_step: int | None
    detail: str | None
    by: str | None = Field(description="the token that gave the verdict")
    at: datetime


class VerdictIn(_In):
    verdict: Verdict = Field(strict=False)
    metric: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=_TEXT,
        description="What was measured, e.g. `loss` or `grad_norm`.",
    )
    value: float | None = Field(
        default=None,
        strict=False,
        description='What it measured; NaN and Inf as the strings "NaN", "Infinity".',
    )
    at_step: int | None = Field(
        default=None, ge=0, le=2**53 - 1, description="The training step that measured it."
    )
    detail: str | None = Field(
        default=None, min_length=1, max_length=MAX_REASON_CHARS, pattern=_TEXT
    )


class LineageNodeOut(_Out):
    id: int
    job: str
    step: int
    branch: int
    superseded: bool
    health: Verdict | None
    created_at: datetime
    parent_id: int | None
    provenance: dict[str, Any] | None


class LineageOut(_Out):
    checkpoint: LineageNodeOut
    ancestors: list[LineageNodeOut] = Field(
        description="parent first, up to the root (across branches and jobs)"
    )
    descendants: list[LineageNodeOut] = Field(
        description="every checkpoint whose ancestry holds it, breadth first, at most `limit`"
    )
    truncated: bool = Field(description="more descendants than `limit`")
