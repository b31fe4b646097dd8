"""The timeline machine's own model (timeline.py): what each save wrote, on which branch,
which checkpoints a rollback superseded, the verdicts and the fork. Kept from what the test did,
never read back from tierpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

# Only the newest checkpoint anywhere: a superseded or older checkpoint is kept only by what the
# timeline protects (the newest good one, a fork's parent).
NEWEST_ONLY = {
    "format": 1,
    "kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}},
    "durable": {"keep_last": 1},
}
GONE = ("expiring", "expired")


@dataclass
class Saved:
    job: str
    step: int
    branch: int
    files: dict[str, bytes]  # path -> bytes, all on the first writer
    superseded: bool = False
    verdict: str | None = None
    # Tiers restorable when a protection began (newest good, fork parent).
    kept_tiers: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        return str(self.step) if self.branch == 1 else f"{self.step}.b{self.branch}"


@dataclass
class Timeline:
    job: str
    saved: list[Saved] = field(default_factory=list)
    branch: dict[str, int] = field(default_factory=dict)  # job -> its current branch
    # The step the job's current branch started from (a rollback to it again before anything
    # is saved on the branch is a retry of that rollback).
    branch_from: int | None = None
    fork_parent: Saved | None = None
    # Something retention would see differently happened since its last run.
    changed: bool = False

    @property
    def child(self) -> str:
        return f"{self.job}-fork"

    def of(self, job: str, step: int, branch: int) -> Saved | None:
        return next(
            (s for s in self.saved if (s.job, s.step, s.branch) == (job, step, branch)), None
        )

    def timeline(self, job: str) -> list[Saved]:
        return sorted((s for s in self.saved if s.job == job and not s.superseded), key=_step)

    def newest_good(self) -> Saved | None:
        good = [s for s in self.timeline(self.job) if s.verdict == "good"]
        return good[-1] if good else None


def _step(s: Saved) -> int:
    return s.step
