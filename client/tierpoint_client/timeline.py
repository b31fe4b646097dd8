"""A run's timeline as the API answers it: branches and rollbacks, forks, health verdicts and
lineage (docs/timeline.md tells what each means). Dataclasses mirroring the JSON, parsed as
`models/` parses its shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Verdict = Literal["good", "suspect", "bad"]
VERDICTS: tuple[Verdict, ...] = ("good", "suspect", "bad")


def _dt(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _number(value: Any) -> float | None:
    """A JSON number, or NaN/Inf as the server writes them (strings "NaN", "Infinity")."""
    if value is None:
        return None
    return float(value)


def step_dir(step: int, branch: int = 1) -> str:
    """A checkpoint's directory under its job's, on every tier: the step on a job's first
    branch, `<step>.b<branch>` on later ones (the server's rule, which a writer follows when it
    writes to the local tier), so a step saved again after a rollback never shares a file with
    the checkpoint it supersedes."""
    return str(int(step)) if branch == 1 else f"{int(step)}.b{int(branch)}"


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint, named across jobs and branches."""

    job: str
    step: int
    branch: int = 1
    id: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointRef:
        return cls(
            job=d["job"],
            step=int(d["step"]),
            branch=int(d.get("branch") or 1),
            id=int(d["id"]) if d.get("id") is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "step": self.step, "branch": self.branch}


@dataclass(frozen=True)
class Health:
    """A checkpoint's health verdict and its evidence: what was measured, at which training
    step, and who said so."""

    verdict: Verdict
    metric: str | None
    value: float | None
    at_step: int | None
    detail: str | None
    by: str | None
    at: datetime | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Health:
        verdict = d["verdict"]
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        return cls(
            verdict=verdict,
            metric=d.get("metric"),
            value=_number(d.get("value")),
            at_step=int(d["at_step"]) if d.get("at_step") is not None else None,
            detail=d.get("detail"),
            by=d.get("by"),
            at=_dt(d.get("at")),
        )


def value_json(value: float | None) -> float | str | None:
    """A measured value as the API takes it: NaN and Inf as strings (JSON has no such numbers)."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


@dataclass(frozen=True)
class Branch:
    number: int
    parent: int | None
    from_step: int | None
    created_at: datetime | None
    created_by: str | None
    reason: str | None
    current: bool
    # How the branch names a step's directory on every tier, `{step}` for the step.
    step_dir: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Branch:
        return cls(
            number=int(d["number"]),
            parent=int(d["parent"]) if d.get("parent") is not None else None,
            from_step=int(d["from_step"]) if d.get("from_step") is not None else None,
            created_at=_dt(d.get("created_at")),
            created_by=d.get("created_by"),
            reason=d.get("reason"),
            current=bool(d.get("current", False)),
            step_dir=d.get("step_dir") or ("{step}" if int(d["number"]) == 1 else ""),
        )

    def dir_of(self, step: int) -> str:
        return step_dir(step, self.number)


@dataclass(frozen=True)
class Branches:
    job: str
    current: int
    items: tuple[Branch, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Branches:
        return cls(
            job=d["job"],
            current=int(d["current"]),
            items=tuple(Branch.from_json(b) for b in d.get("items") or ()),
        )


@dataclass(frozen=True)
class Rollback:
    """A rollback's answer: the new branch (or, `created` false, the one a retry of it made) and
    the steps it superseded."""

    job: str
    created: bool
    branch: Branch
    superseded: tuple[int, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rollback:
        return cls(
            job=d["job"],
            created=bool(d["created"]),
            branch=Branch.from_json(d["branch"]),
            superseded=tuple(int(s) for s in d.get("superseded") or ()),
        )


@dataclass(frozen=True)
class Fork:
    job: str
    created: bool
    parent: CheckpointRef
    created_at: datetime | None
    created_by: str | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Fork:
        return cls(
            job=d["job"],
            created=bool(d["created"]),
            parent=CheckpointRef.from_json(d["parent"]),
            created_at=_dt(d.get("created_at")),
            created_by=d.get("created_by"),
        )


@dataclass(frozen=True)
class LineageNode:
    id: int
    job: str
    step: int
    branch: int
    superseded: bool
    health: Verdict | None
    created_at: datetime | None
    parent_id: int | None
    provenance: dict[str, Any] | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LineageNode:
        return cls(
            id=int(d["id"]),
            job=d["job"],
            step=int(d["step"]),
            branch=int(d["branch"]),
            superseded=bool(d.get("superseded", False)),
            health=d.get("health"),
            created_at=_dt(d.get("created_at")),
            parent_id=int(d["parent_id"]) if d.get("parent_id") is not None else None,
            provenance=d.get("provenance"),
        )


@dataclass(frozen=True)
class Lineage:
    """A checkpoint's ancestry (parent first, up to the root, across branches and jobs) and its
    descendants (breadth first, at most the limit asked for)."""

    checkpoint: LineageNode
    ancestors: tuple[LineageNode, ...]
    descendants: tuple[LineageNode, ...]
    truncated: bool

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lineage:
        return cls(
            checkpoint=LineageNode.from_json(d["checkpoint"]),
            ancestors=tuple(LineageNode.from_json(n) for n in d.get("ancestors") or ()),
            descendants=tuple(LineageNode.from_json(n) for n in d.get("descendants") or ()),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass(frozen=True)
class Loaded:
    """A checkpoint a run loaded: which one (across jobs and branches), and the metadata its
    writer recorded with it (the loss and gradient norm a guard compares the next steps with)."""

    ref: CheckpointRef
    metadata: dict[str, Any]
