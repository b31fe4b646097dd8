"""What lifecycle activities take and return. Small by design: ids and ordinal ranges travel
through the workflow history, never shard lists or bytes."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tierpoint.config import TierKind

# Activity names (the workflow calls them by name, so it imports nothing with I/O).
PLAN = "lifecycle.plan"
SEAL_BATCH = "lifecycle.seal_batch"
COPY_BATCH = "lifecycle.copy_batch"
PROMOTE = "lifecycle.promote"

# How many "path: reason" examples a batch result carries back into the history.
PROBLEM_EXAMPLES = 5


class PlanInput(BaseModel):
    checkpoint_id: int


class PlanTier(BaseModel):
    name: str
    kind: TierKind
    parallelism: int


class Batch(BaseModel):
    """The shards of one node whose manifest ordinals lie in [first, last]."""

    node: str
    first: int
    last: int


class Plan(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    shard_count: int
    total_bytes: int
    tiers: list[PlanTier]
    batches: list[Batch]
    # A stage with more batches than this runs them in child workflows of at most this many,
    # so no history grows with the number of nodes either.
    batches_per_child: int = 1000
    # heartbeat_timeout of the batch activities (Settings.batch_heartbeat_timeout_seconds); the
    # default is what histories recorded before this field ran with.
    batch_heartbeat_seconds: float = 60.0


class BatchInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    batch: Batch


class SealInput(BatchInput):
    tier: str


class CopyInput(BatchInput):
    source: str
    destination: str


class BatchResult(BaseModel):
    shards: int = 0
    verified: int = 0  # now verified on the tier (including ones that already were)
    skipped: int = 0  # already verified before this attempt
    corrupt: int = 0
    bytes: int = 0  # bytes read in this attempt
    problems: list[str] = Field(default_factory=list)  # first few "path: reason"


class PromoteInput(BaseModel):
    checkpoint_id: int
    tier: str
    # Tiers after this one: failed with "source tier <tier> failed" if this one fails.
    later_tiers: list[str] = Field(default_factory=list)
    # Why the stage could not finish (e.g. a batch that exhausted its retries), for the reason.
    stage_error: str | None = None


class PromoteResult(BaseModel):
    tier: str
    state: str
    reason: str | None = None


# ------------------------------------------------------------------ retention

RETENTION_PLAN = "retention.plan"
RETENTION_BEGIN = "retention.begin_expiry"
RETENTION_DELETE = "retention.delete_copy"
RETENTION_FINISH = "retention.finish_expiry"
RETENTION_REQUEST = "retention.request"
RETENTION_LIST_JOBS = "retention.list_jobs"
RETENTION_REQUEST_MANY = "retention.request_many"

# Expiries one plan activity hands to the workflow; the workflow plans again for the rest.
EXPIRIES_PER_ROUND = 200


class RetentionPlanInput(BaseModel):
    job: str
    limit: int = EXPIRIES_PER_ROUND


class ExpiryTask(BaseModel):
    checkpoint_id: int
    step: int
    tier: str
    kind: TierKind
    bytes: int
    # not_kept / max_bytes; None: an expiry an earlier run began (marker already `expiring`)
    rule: str | None = None
    # local tiers: the nodes whose local root may hold the copy (deleted on each node's queue)
    nodes: list[str] = Field(default_factory=list)


class RetentionPlanResult(BaseModel):
    tasks: list[ExpiryTask] = Field(default_factory=list)
    more: bool = False
    policy: str = ""


class ExpiryInput(BaseModel):
    job: str
    checkpoint_id: int
    tier: str


class BeginResult(BaseModel):
    # expiring: delete the bytes now; expired: already done; skipped: must not expire now
    state: str
    rule: str | None = None
    reason: str | None = None


class DeleteInput(BaseModel):
    job: str
    checkpoint_id: int
    step: int
    tier: str
    node: str | None = None  # local tiers: the node whose copy this deletes


class FinishResult(BaseModel):
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


class JobPage(BaseModel):
    jobs: list[str] = Field(default_factory=list)
    # name to continue after, None on the last page
    next_after: str | None = None
