"""Integrity: the scrub (`Scrub`, started by the `tierpoint.scrub` schedule, and one `ScrubUnit`
child per tier and node), the repair of a checkpoint's damaged copies (`CheckpointRepair`, id
`checkpoint/<job>/<step>/repair`), re-verification of reported replicas (`VerifyReplicas`) and
reconciliation of the catalog with the tiers (`Reconcile`).

Payloads are ids and counts; reports carry at most REPORT_EXAMPLES examples per kind.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from pydantic import BaseModel, Field

from tierpoint.contract.common import FailureType, backoff
from tierpoint.contract.lifecycle import Batch, checkpoint_key
from tierpoint.tier_config import TierKind

SCRUB_WORKFLOW = "Scrub"
SCRUB_UNIT_WORKFLOW = "ScrubUnit"
SCRUB_SCHEDULE_ID = "tierpoint.scrub"
VERIFY_WORKFLOW = "VerifyReplicas"
VERIFY_CHECKPOINT_WORKFLOW = "VerifyCheckpoint"
REPAIR_WORKFLOW = "CheckpointRepair"
REPAIR_SIGNAL = "request"
RECONCILE_WORKFLOW = "Reconcile"
RECONCILE_SCHEDULE_ID = "tierpoint.reconcile"

SCRUB_PLAN = "scrub.plan"
SCRUB_PICK = "scrub.pick"
SCRUB_BATCH = "scrub.verify_batch"
VERIFY_PICK = "scrub.verify_pick"
REPAIR_PLAN = "repair.plan"
REPAIR_COPY = "repair.copy_batch"
REPAIR_REQUEST = "repair.request"
RECONCILE_PLAN = "reconcile.plan"
RECONCILE_SCAN = "reconcile.scan"

# Replicas one scrub batch activity reads back; batches a unit runs per scrub run.
SCRUB_BATCH_REPLICAS = 200
SCRUB_BATCHES_PER_RUN = 50
# Units (tier x node) a scrub run handles before it continues as new; children at once.
SCRUB_UNITS_PER_RUN = 200
SCRUB_UNIT_WINDOW = 16
# Picks (of up to SCRUB_BATCH_REPLICAS replicas) one checkpoint verification run reads before it
# continues as new.
VERIFY_PICKS_PER_RUN = 50
# Repair batches one repair round hands to the workflow; rounds before continue-as-new.
REPAIR_BATCHES_PER_ROUND = 200
REPAIR_ROUNDS_PER_RUN = 10
REPORT_EXAMPLES = 20
PROBLEM_LIMIT = 5

# Reading bytes back: long, heartbeating, resumed at the replica the last heartbeat named.
READ_TIMEOUT = timedelta(hours=12)
READ_HEARTBEAT = timedelta(minutes=2)
# A node that is down (not declared lost) serves nothing: a scrub or scan waiting on its queue gives
# up after this, so one absent node cannot hold every later run (schedules skip while one runs).
NODE_QUEUE_WAIT = timedelta(minutes=10)
# A repair round whose copies found a source replica bad (gone or corrupt since the plan) asks for
# one more round, planned from the copies left (histories recorded before ended there).
REPAIR_AGAIN_PATCH = "repair-again-after-source-found-bad"
READ_RETRY = backoff(timedelta(minutes=2), 20, FailureType.UNKNOWN_TIER, FailureType.WRONG_NODE)


def repair_workflow_id(job: str, step: int, branch: int = 1) -> str:
    return f"checkpoint/{checkpoint_key(job, step, branch)}/repair"


def verify_checkpoint_workflow_id(job: str, step: int, tier: str, branch: int = 1) -> str:
    return f"checkpoint/{checkpoint_key(job, step, branch)}/verify/{tier}"


class ScrubInput(BaseModel):
    offset: int = 0  # units handled by earlier runs of this chain (continue-as-new)


class ScrubUnit(BaseModel):
    """One tier (and node, for a local tier) scrubbed at its own rate."""

    tier: str
    kind: TierKind
    node: str | None = None
    bandwidth: int  # bytes/s
    budget: int  # bytes this run may read
    min_age_seconds: float


class ScrubPlan(BaseModel):
    units: list[ScrubUnit] = Field(default_factory=list)


class ScrubPickInput(BaseModel):
    unit: ScrubUnit
    budget: int
    limit: int = SCRUB_BATCH_REPLICAS
    # the first pick's time (ISO 8601): later picks of the run take only replicas last read
    # before it, so no replica is read twice in one run; "" for the first pick
    cutoff: str = ""


class ScrubPick(BaseModel):
    replica_ids: list[int] = Field(default_factory=list)
    # a coded peer tier's unit picks the stripes its holder holds instead
    stripe_ids: list[int] = Field(default_factory=list)
    bytes: int = 0
    # when picked (ISO 8601, the catalog's clock): a replica scrubbed after it is not counted again
    picked_at: str = ""


class ScrubBatchInput(BaseModel):
    tier: str
    node: str | None = None
    replica_ids: list[int]
    stripe_ids: list[int] = Field(default_factory=list)  # read on their holder, `node`
    bandwidth: int
    picked_at: str
    actor: str = "scrub"


class ScrubBatchResult(BaseModel):
    replicas: int = 0  # read back and good
    stripes: int = 0  # stripes read back and good; on a coded tier corrupt and lost are stripes
    bytes: int = 0
    corrupt: int = 0
    lost: int = 0
    skipped: int = 0  # not verified any more when read (expired, already marked)
    # checkpoints with a replica found bad: repair is requested for them
    damaged: list[int] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class ScrubUnitResult(BaseModel):
    tier: str
    node: str | None = None
    batches: int = 0
    replicas: int = 0
    stripes: int = 0
    bytes: int = 0
    corrupt: int = 0
    lost: int = 0


class ScrubResult(BaseModel):
    units: int = 0
    replicas: int = 0
    stripes: int = 0
    bytes: int = 0
    corrupt: int = 0
    lost: int = 0


class VerifyInput(BaseModel):
    """Re-read named replicas (or a coded tier's stripes, on their holder `node`) now (a reader
    reported them bad), whatever their age."""

    tier: str
    node: str | None = None
    replica_ids: list[int]
    stripe_ids: list[int] = Field(default_factory=list)
    actor: str = "report"


class VerifyOutcome(BaseModel):
    """What an operator's verification of a checkpoint's copy on one tier read."""

    read: int = 0
    good: int = 0
    corrupt: int = 0
    lost: int = 0
    skipped: int = 0  # no longer verified when its turn came (expired, marked meanwhile)
    bytes: int = 0
    repair_requested: bool = False
    problems: list[str] = Field(default_factory=list)

    def add(self, res: ScrubBatchResult) -> None:
        # On a coded tier what is read is stripes: counted the same way.
        self.read += res.replicas + res.stripes + res.corrupt + res.lost
        self.good += res.replicas + res.stripes
        self.corrupt += res.corrupt
        self.lost += res.lost
        self.skipped += res.skipped
        self.bytes += res.bytes
        self.repair_requested = self.repair_requested or bool(res.damaged)
        self.problems = (self.problems + res.problems)[:PROBLEM_LIMIT]


class VerifyCheckpointInput(BaseModel):
    """Re-read every verified replica (a coded tier: stripe) of one checkpoint on one tier, in
    id order."""

    checkpoint_id: int
    tier: str
    kind: TierKind
    after_id: int = 0  # replicas up to this id were read by earlier runs (continue-as-new)
    so_far: VerifyOutcome = Field(default_factory=VerifyOutcome)
    pick_limit: int = SCRUB_BATCH_REPLICAS
    picks_per_run: int = VERIFY_PICKS_PER_RUN


class VerifyPickInput(BaseModel):
    checkpoint_id: int
    tier: str
    after_id: int
    limit: int = SCRUB_BATCH_REPLICAS


class VerifyBatch(BaseModel):
    node: str | None = None  # the node whose queue reads it (local tier), else the shared queue
    replica_ids: list[int]
    stripe_ids: list[int] = Field(default_factory=list)  # a coded tier's, on their holder `node`


class VerifyPick(BaseModel):
    batches: list[VerifyBatch] = Field(default_factory=list)
    last_id: int = 0
    more: bool = False


class RepairRequest(BaseModel):
    reason: str


class RepairInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    pending: bool = True
    rounds_before: int = 0


class RepairPlanInput(BaseModel):
    checkpoint_id: int
    limit: int = REPAIR_BATCHES_PER_ROUND


class RepairBatch(BaseModel):
    batch: Batch
    # the node's queue when the batch reads or writes its local tier (a peer copy's: its
    # holder's, `batch.runs_on`), else the shared queue
    on_node: bool


class RepairTier(BaseModel):
    tier: str
    parallelism: int
    batches: list[RepairBatch] = Field(default_factory=list)


class RepairPlan(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    tiers: list[RepairTier] = Field(default_factory=list)
    # tiers with damage that repair leaves alone, and why ("s3: no verified source of 2 shards")
    left: list[str] = Field(default_factory=list)
    more: bool = False


class RepairCopyInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    batch: Batch
    destination: str


class RepairOutcome(BaseModel):
    tier: str
    state: str
    reason: str | None = None


class RepairResult(BaseModel):
    checkpoint_id: int
    rounds: int = 0
    tiers: list[RepairOutcome] = Field(default_factory=list)
    left: list[str] = Field(default_factory=list)


class RepairStartInput(BaseModel):
    checkpoint_ids: list[int]
    reason: str


class ReconcileInput(BaseModel):
    tier: str | None = None
    job: str | None = None
    repair: bool = False


class ReconcileUnit(BaseModel):
    tier: str
    kind: TierKind
    node: str | None = None


class ReconcilePlan(BaseModel):
    units: list[ReconcileUnit] = Field(default_factory=list)
    grace_seconds: float = 3600.0  # Settings.reconcile_grace


class ReconcileScanInput(BaseModel):
    unit: ReconcileUnit
    job: str | None = None
    repair: bool = False
    grace_seconds: float


class Finding(StrEnum):
    MISSING = "missing"  # a verified replica whose file/object is not there
    WRONG_SIZE = "wrong_size"  # there, with another size than the shard's
    EXTRA = "extra"  # a file/object no replica of the catalog names: reported, never deleted
    ABANDONED_TEMP = "abandoned_temp"  # a copy's temp file older than the grace period
    ABANDONED_UPLOAD = "abandoned_upload"  # a multipart upload older than the grace period


class TierReport(BaseModel):
    tier: str
    node: str | None = None
    scanned: int = 0  # files/objects listed
    checked: int = 0  # verified replicas compared
    counts: dict[str, int] = Field(default_factory=dict)  # Finding -> how many
    examples: dict[str, list[str]] = Field(default_factory=dict)  # Finding -> paths/keys
    marked: int = 0  # replicas marked lost/corrupt (repair only)
    cleaned: int = 0  # abandoned temp files/uploads removed (repair only)
    damaged: list[int] = Field(default_factory=list)  # checkpoints repair was requested for
    error: str | None = None


class ReconcileReport(BaseModel):
    tier: str | None = None
    job: str | None = None
    repair: bool = False
    tiers: list[TierReport] = Field(default_factory=list)
    repairs_requested: int = 0
