"""Retention execution: `JobRetention` (the one retention run of a job, id `retention/<job>`),
`RetentionSweep` (started by the `tierpoint.retention-sweep` schedule) and their activities."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from pydantic import BaseModel, Field

from tierpoint.contract.common import FailureType, backoff
from tierpoint.tier_config import TierKind

RETENTION_WORKFLOW = "JobRetention"
REQUEST_SIGNAL = "request"
SWEEP_WORKFLOW = "RetentionSweep"
SWEEP_SCHEDULE_ID = "tierpoint.retention-sweep"
SWEEP_REASON = "periodic sweep"

PLAN = "retention.plan"
BEGIN = "retention.begin_expiry"
# A round's copies begun at once, under one fresh plan (runs recorded earlier begin each copy).
BEGIN_ROUND = "retention.begin_round"
DELETE = "retention.delete_copy"
FINISH = "retention.finish_expiry"
REQUEST = "retention.request"
LIST_JOBS = "retention.list_jobs"
REQUEST_MANY = "retention.request_many"

# Expiries one plan activity hands to the workflow; the workflow plans again for the rest.
EXPIRIES_PER_ROUND = 200
# See RetentionInput.rounds_per_run.
ROUNDS_PER_RUN = 20

# Asking for a retention run is best effort: the periodic sweep asks again.
REQUEST_RETRY = backoff(timedelta(seconds=30), 5)
# Deleting a checkpoint's directory or S3 prefix. A node that stays away longer than
# DELETE_DEADLINE leaves the copy `expiring` (never restorable again) for a later run.
DELETE_TIMEOUT = timedelta(minutes=30)
DELETE_DEADLINE = timedelta(hours=1)
DELETE_RETRY = backoff(timedelta(minutes=1), 0, FailureType.WRONG_NODE, FailureType.NOT_EXPIRING)


def retention_workflow_id(job: str) -> str:
    return f"retention/{job}"


class RetentionInput(BaseModel):
    job: str
    # A run starts with a pass to do (the start signal asked for it, or continue-as-new carried
    # a request over); False only for a run that should wait for a signal first.
    pending: bool = True
    passes_before: int = 0  # passes of earlier runs of this chain (continue-as-new), for status
    # Rounds (a plan and its expiries) a run does before it continues as new, keeping each run's
    # history bounded; carried along the chain.
    rounds_per_run: int = ROUNDS_PER_RUN


class RetentionRequest(BaseModel):
    reason: str


class RetentionPlanInput(BaseModel):
    job: str
    limit: int = EXPIRIES_PER_ROUND


class ExpiryTask(BaseModel):
    """One copy (a checkpoint on one tier) to expire."""

    checkpoint_id: int
    step: int
    tier: str
    kind: TierKind
    bytes: int
    # not_kept / max_bytes; None: an expiry an earlier run began (tier copy already `expiring`)
    rule: str | None = None
    # local tiers: the nodes whose local root may hold the copy (lost nodes left out); deleted
    # on each node's queue
    nodes: list[str] = Field(default_factory=list)


class RetentionPlanResult(BaseModel):
    tasks: list[ExpiryTask] = Field(default_factory=list)
    # the plan held more than the limit: another round follows
    more: bool = False
    policy: str = ""


class ExpiryInput(BaseModel):
    job: str
    checkpoint_id: int
    tier: str


class BeginState(StrEnum):
    EXPIRING = "expiring"  # the tier copy left `restorable` (committed): delete the bytes now
    EXPIRED = "expired"  # nothing left to do
    SKIPPED = "skipped"  # must not expire now (the re-check under row locks said so)


class BeginResult(BaseModel):
    state: BeginState
    rule: str | None = None
    reason: str | None = None


class CopyRef(BaseModel):
    checkpoint_id: int
    tier: str


class BeginRoundInput(BaseModel):
    job: str
    copies: list[CopyRef] = Field(default_factory=list)


class BeginRoundResult(BaseModel):
    # one per copy asked, in its order
    results: list[BeginResult] = Field(default_factory=list)


class DeleteInput(BaseModel):
    job: str
    checkpoint_id: int
    step: int
    tier: str
    node: str | None = None  # local tiers: the node whose copy this deletes


class FinishResult(BaseModel):
    # `expired`, or the tier copy's state when it was not `expiring` (then nothing changed)
    state: str


class RequestInput(BaseModel):
    job: str
    reason: str


class RequestManyInput(BaseModel):
    jobs: list[str]
    reason: str


class ListJobsInput(BaseModel):
    after: str | None = None
    limit: int = 1000


class JobNamesPage(BaseModel):
    jobs: list[str] = Field(default_factory=list)
    # name to continue after, None on the last page
    next_after: str | None = None


class RetentionStatus(BaseModel):
    """The answer to JobRetention's `status` query."""

    job: str
    passes: int = 0  # passes finished, this run and the runs it continued from
    requests: int = 0  # requests received by this run
    expired: int = 0  # expiries finished by this run
    skipped: int = 0  # expiries the re-check refused in this run
    failed: int = 0  # expiries left `expiring` by this run (deletion failed)
    last_reasons: list[str] = Field(default_factory=list)
    last_skip: str | None = None
    last_failure: str | None = None
    policy: str = ""


class RetentionResult(BaseModel):
    job: str
    passes: int
    expired: int
    skipped: int
    failed: int


class SweepResult(BaseModel):
    jobs: int
