"""What the retention planner reads (a snapshot of one job's catalog rows) and what it returns.

Plain frozen pydantic models: they travel through Temporal's pydantic data converter and render as
the API's dry-run answer without translation.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from tierpoint.states import TierState

from .policy import TierRef


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TierCopy(_Frozen):
    """One checkpoint's copy on one tier: its tier copy and what its replicas hold."""

    state: TierState
    # every shard has a replica on the tier whose bytes were read back and matched (invariant 1)
    verified: bool
    # bytes the copy occupies on the tier now (partial copies count what was written)
    bytes: int = Field(ge=0)
    # hidden from restores (a job's failed load, or an operator's verdict)
    quarantined: bool = False
    # quarantined by an operator as evidence: retention never expires it (meaningful only when
    # `quarantined`; a training job's quarantine hides a copy but leaves it to the policy)
    evidence: bool = False
    # part of the copy was on a node declared lost (a local copy's node, a peer copy's holder):
    # those bytes are gone with the node, so a failed copy there is retention's to expire
    on_lost_node: bool = False
    # this copy is being made again (re-replication, repair) and reads from the copies on these
    # tiers: a hold recorded by the rebuild's plan, cleared by its promotion, and given to the
    # planner only while it has not lapsed
    rebuild_from: frozenset[str] = frozenset()


class CheckpointInfo(_Frozen):
    id: int
    step: int = Field(ge=0)
    created_at: datetime
    total_bytes: int = Field(ge=0)
    pinned: bool = False
    tags: frozenset[str] = frozenset()
    quarantined: bool = False
    evidence: bool = False  # as TierCopy.evidence, for the whole checkpoint
    # an unreleased restore lease that has not expired at snapshot time
    leased: bool = False
    copies: dict[str, TierCopy] = Field(default_factory=dict)
    # A run's timeline (docs/timeline.md): a rollback left it behind (expired first: it counts
    # as older than every checkpoint on the timeline); its health verdict is good; a job forked
    # from it has no restorable checkpoint of its own yet.
    superseded: bool = False
    good: bool = False
    child_needs: bool = False


class RetentionSnapshot(_Frozen):
    job: str
    tiers: tuple[TierRef, ...]
    checkpoints: tuple[CheckpointInfo, ...]


class KeepReason(StrEnum):
    """Why a copy stays. The first group are protections: never overridden, not even by a quota."""

    PINNED = "pinned"
    LEASED = "leased"
    QUARANTINED = "quarantined"  # an operator's evidence; never expired automatically
    LATEST_DURABLE = "latest_durable"  # the job's latest restorable checkpoint on its last tier
    IN_FLIGHT = "in_flight"  # a copy to a more durable target is pending (this may be its source)
    AWAITING_DURABLE = "awaiting_durable"  # local, not yet restorable on a more durable target
    REBUILD_SOURCE = "rebuild_source"  # a copy on another tier is being made again from this one
    LAST_COPY = "last_copy"  # the only restorable copy left of a checkpoint some tier keeps
    NO_GOOD_COPY = "no_good_copy"  # a kept checkpoint with no restorable copy: keep every remnant
    NEWEST_GOOD = "newest_good"  # the job's newest checkpoint with a good health verdict
    FORK_PARENT = "fork_parent"  # a job forked from it has no restorable checkpoint of its own
    # Rules of the tier's policy: a quota (max_bytes) may override these, oldest first.
    KEEP_ALL = "keep_all"
    KEEP_LAST = "keep_last"
    KEEP_EVERY_STEPS = "keep_every.steps"
    KEEP_EVERY_INTERVAL = "keep_every.interval"
    KEEP_WITHIN = "keep_within"
    KEEP_TAGS = "keep_tags"


PROTECTIONS = frozenset(
    {
        KeepReason.PINNED,
        KeepReason.LEASED,
        KeepReason.QUARANTINED,
        KeepReason.LATEST_DURABLE,
        KeepReason.IN_FLIGHT,
        KeepReason.AWAITING_DURABLE,
        KeepReason.REBUILD_SOURCE,
        KeepReason.LAST_COPY,
        KeepReason.NO_GOOD_COPY,
        KeepReason.NEWEST_GOOD,
        KeepReason.FORK_PARENT,
    }
)


class ExpiryRule(StrEnum):
    NOT_KEPT = "not_kept"  # none of the tier's keep rules keeps this checkpoint
    MAX_BYTES = "max_bytes"  # the tier's quota evicted it (oldest unprotected first)


class Expiry(_Frozen):
    checkpoint_id: int
    step: int
    tier: str
    bytes: int
    rule: ExpiryRule
    reason: str


class Keep(_Frozen):
    checkpoint_id: int
    step: int
    tier: str
    bytes: int
    # every reason that keeps the copy, protections first, in KeepReason order
    reasons: tuple[KeepReason, ...]

    @property
    def protected(self) -> bool:
        """True if a protection holds the copy (a quota cannot evict it)."""
        return any(r in PROTECTIONS for r in self.reasons)


class Unfinished(_Frozen):
    """A tier copy already `expiring`: an earlier run committed to deleting it and did
    not finish. No reader is sent there any more; the executor completes the deletion."""

    checkpoint_id: int
    step: int
    tier: str
    bytes: int


class TierUsage(_Frozen):
    tier: str
    kind: str
    bytes_now: int
    bytes_after: int
    max_bytes: int | None
    # None without a quota; False when protections leave the tier over its quota
    quota_met: bool | None
    over_by: int = 0
    rule: str  # the tier's rules as written, for the dry-run reader


class RetentionPlan(_Frozen):
    job: str
    now: datetime
    # ordered by tier (fastest first), then step, then checkpoint id
    expiries: tuple[Expiry, ...]
    keeps: tuple[Keep, ...]
    unfinished: tuple[Unfinished, ...]
    usage: tuple[TierUsage, ...]
    notes: tuple[str, ...] = ()
