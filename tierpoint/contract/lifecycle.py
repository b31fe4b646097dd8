"""The checkpoint lifecycle: `CheckpointLifecycle` (one per checkpoint, id
`checkpoint/<job>/<step>`), its stage children, and the lifecycle activities.

The history grows with batches (ranges of manifest ordinals per node), never with shards.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, Field

from tierpoint.contract.common import FailureType, backoff
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

LIFECYCLE_WORKFLOW = "CheckpointLifecycle"
STAGE_WORKFLOW = "CheckpointLifecycleStage"

PLAN = "lifecycle.plan"
SEAL_BATCH = "lifecycle.seal_batch"
COPY_BATCH = "lifecycle.copy_batch"
PROMOTE = "lifecycle.promote"

# Histories recorded before the lifecycle asked for retention runs replay without those activities.
RETENTION_PATCH = "request-retention-after-promote"
# Histories recorded before it ran plan, promote and the retention requests as local activities
# (in the workflow's own worker: no task-queue round trip, no workflow task of their own) and
# windowed node stages per node replay as they ran. It implies RETENTION_PATCH.
LOCAL_STEPS_PATCH = "local-catalog-steps-window-per-node"
# The children of a stage on the nodes' queues run at once (they ran one after the other).
NODE_CHILDREN_PATCH = "node-stage-children-at-once"
# A copy that found its source replica corrupt makes the lifecycle ask for the checkpoint's repair
# when it ends (histories recorded before ended without that request).
SOURCE_REPAIR_PATCH = "repair-after-source-found-corrupt"
# Every later tier copies from the sealed tier at once, each promoted on its own (histories
# recorded before copied tier after tier, each from the one before).
FAN_OUT_PATCH = "copies-fan-out-from-the-sealed-tier"
# A pass of a coded tier's copy stage with more batches than `batches_per_child` runs in child
# workflows, as any other stage does (histories recorded before ran every pass in the lifecycle).
CODED_CHILDREN_PATCH = "coded-stage-passes-in-children"
# A stage child is told of the nodes declared lost while it was starting, which the signals
# passed on meanwhile could not reach (histories recorded before sent it none).
CHILD_LOST_CATCH_UP_PATCH = "stage-child-told-nodes-lost-while-it-started"

# Beyond this many batches in a stage (one node has at least one batch, so this is about the
# number of nodes), the stage runs in child workflows of this many batches each. At 1,000 (the
# value before) a 1,000-node rehearsal's lifecycle had 1,000 batch coroutines in one workflow: an
# activation handling a burst of their completions on a busy worker ran past the SDK's 2 s
# deadlock detector, and the eviction that followed never finished, so the lifecycle hung. The
# value travels in the plan, so recorded histories replay with the one they were planned with.
BATCHES_PER_CHILD = 250
# How many "path: reason" examples a batch result carries back into the history.
PROBLEM_EXAMPLES = 5

# Batch activities move bytes: long, heartbeating, resumed from their heartbeat on retry. Their
# heartbeat timeout comes with the plan (a setting), so the workflow reads no settings of its own.
BATCH_TIMEOUT = timedelta(hours=12)
BATCH_RETRY = backoff(
    timedelta(minutes=2),
    20,
    FailureType.UNSAFE_PATH,
    FailureType.UNKNOWN_TIER,
    FailureType.WRONG_NODE,
    FailureType.CHECKPOINT_NOT_FOUND,
    FailureType.NODE_LOST,
)

# Signal to a running lifecycle: this node was declared lost (argument: the node id). Batches on
# the node's queue stop being waited for; no worker may ever serve that queue again.
NODE_LOST_SIGNAL = "node_lost"


def checkpoint_key(job: str, step: int, branch: int = 1) -> str:
    """How every workflow id names its checkpoint: `<job>/<step>` on a job's first branch (as
    before branches, so runs started then are still found under their ids), `<job>/<step>.b<N>`
    on later ones: a step saved again after a rollback is another checkpoint, and its lifecycle,
    repairs, verifications and re-replications are its own, never joined to the superseded
    one's."""
    # guard: workflow-ids-per-checkpoint
    where = str(step) if branch == 1 else f"{step}.b{branch}"
    return f"{job}/{where}"


def workflow_id(job: str, step: int, branch: int = 1) -> str:
    """A checkpoint's lifecycle: `checkpoint/<job>/<step>`, `.b<N>` after the step on later
    branches (`checkpoint_key`)."""
    return f"checkpoint/{checkpoint_key(job, step, branch)}"


def retry_workflow_id(job: str, step: int, attempt: int, branch: int = 1) -> str:
    """The lifecycle run an operator's retry starts: a new run of the same workflow on the same
    checkpoint, under its own id so that the first run's history stays as it ended."""
    return f"{workflow_id(job, step, branch)}/retry-{attempt}"


class LifecycleInput(BaseModel):
    checkpoint_id: int
    job: str
    step: int
    # When the catalog registered the checkpoint: with the id, which registration a run is for.
    # An id alone repeats after the catalog is restored from a backup (its sequences go back to
    # the dump's), while Temporal keeps the closed runs of the checkpoints registered since.
    # None in the histories of runs started before it was carried.
    registered_at: datetime | None = None
    # The job's branch it was saved on (its workflow id names it); 1 in histories recorded
    # before branches.
    branch: int = 1


class PlanInput(BaseModel):
    checkpoint_id: int


class PlanTier(BaseModel):
    name: str
    kind: TierKind
    parallelism: int
    # A coded peer tier's code ("rs(k,m)"): its copy stage encodes, pulls and unstages stripes
    # (`StripePhase`). None for every other tier, and in histories recorded before.
    code: str | None = None


class StripePhase(StrEnum):
    """The three passes of a coded tier's copy stage, in order: each shards' node cuts its
    files into stripes, each holder pulls its own, each shards' node drops the stripes of the
    sets verified whole from its staging area."""

    ENCODE = "encode"
    PULL = "pull"
    UNSTAGE = "unstage"
    # Not a pass of the copy stage: a re-replication's, each new holder cutting again the
    # stripes lost with their holder (`PeerRereplicate`).
    REBUILD = "rebuild"


class Batch(BaseModel):
    """The shards of one node whose manifest ordinals lie in [first, last]."""

    node: str
    first: int
    last: int
    # A copy to a peer tier: the node that holds the copy, whose queue runs the batch (it pulls
    # from `node`'s data endpoint). None for every other stage.
    holder: str | None = None
    # A peer copy made again (re-replication) from another copy than the stage's source (the
    # shards' node's local copy): the tier the holder reads them from, verified: another local
    # tier, another peer tier, the shared tier, S3. None: the stage's source; always None in
    # histories recorded before.
    source_tier: str | None = None
    # With `source_tier` on the nodes: the node whose data endpoint serves that copy (the shards'
    # node for a local copy, its holder for a peer copy), which must stay alive. None: no node
    # (shared, S3); always None in histories recorded before.
    source_node: str | None = None

    @property
    def runs_on(self) -> str:
        """The node whose queue runs this batch in a stage on the nodes' queues."""
        return self.holder or self.node


class LifecyclePlan(BaseModel):
    """What the plan activity decided: the tiers this step goes to, in order, and its batches."""

    checkpoint_id: int
    job: str
    step: int
    shard_count: int
    total_bytes: int
    tiers: list[PlanTier]
    batches: list[Batch]
    # A stage with more batches than this runs them in child workflows of at most this many,
    # so no history grows with the number of nodes either.
    batches_per_child: int = BATCHES_PER_CHILD
    # heartbeat_timeout of the batch activities (Settings.batch_heartbeat_timeout_seconds); the
    # default is what histories recorded before this field ran with.
    batch_heartbeat_seconds: float = 60.0
    # Nodes of this checkpoint's shards that were declared lost before the plan: their batches
    # are not scheduled. Empty in histories recorded before nodes could be lost.
    lost_nodes: list[str] = Field(default_factory=list)
    # Per peer tier: each source node's holder (activities/placement.py). Empty without peers.
    holders: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Per coded peer tier: each source node's stripe holders, stripe i on the i-th (placement's
    # `stripe_holders`); a node without them has too few serving nodes. Empty without one.
    stripe_holders: dict[str, dict[str, list[str]]] = Field(default_factory=dict)

    def peer_batches(self, tier: str) -> tuple[list[Batch], list[str]]:
        """The batches of a copy to peer tier `tier`, each on its holder, and the source nodes
        that have no holder (fewer serving nodes than the tier's ring distance needs)."""
        holders = self.holders.get(tier, {})
        batches = [
            b.model_copy(update={"holder": holders[b.node]})
            for b in self.batches
            if b.node in holders
        ]
        return batches, sorted({b.node for b in self.batches if b.node not in holders})


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
    # Shards whose source replica a copy found corrupt (now or on an earlier attempt): the
    # lifecycle asks for the checkpoint's repair.
    source_damaged: int = 0


class PromoteInput(BaseModel):
    checkpoint_id: int
    tier: str
    # Tiers after this one: failed with "source tier <tier> failed" if this one fails.
    later_tiers: list[str] = Field(default_factory=list)
    # Why the stage could not finish (e.g. a batch that exhausted its retries), for the reason.
    stage_error: str | None = None


class PromoteResult(BaseModel):
    tier: str
    state: TierState
    reason: str | None = None


class TierOutcome(BaseModel):
    tier: str
    state: TierState
    reason: str | None = None


class LifecycleResult(BaseModel):
    checkpoint_id: int
    shard_count: int
    batches: int
    tiers: list[TierOutcome] = Field(default_factory=list)


class LifecycleStatus(BaseModel):
    """The answer to the workflow's `status` query."""

    # "starting", "plan", "seal:<tier>", "copy:<tier>[+<tier>...]" (the tiers copied at once),
    # "promote:<tier>", "done"
    stage: str
    tiers_done: list[str] = Field(default_factory=list)
    tiers_failed: list[str] = Field(default_factory=list)
    batches_total: int = 0  # of the current stage (of all its tiers, when they copy at once)
    batches_done: int = 0


class StageInput(BaseModel):
    """One slice of a stage's batches, run by a child workflow when a stage has too many
    batches for one history (e.g. a checkpoint spread over thousands of nodes)."""

    checkpoint_id: int
    job: str
    step: int
    tier: PlanTier
    source: PlanTier | None = None  # None: seal `tier`; else copy source -> tier
    batches: list[Batch]
    # LifecyclePlan.batch_heartbeat_seconds; the default is what earlier histories ran with.
    batch_heartbeat_seconds: float = 60.0
    # Nodes declared lost when the child started (later ones arrive as signals).
    lost_nodes: list[str] = Field(default_factory=list)
    # A stage on the nodes' queues runs `tier.parallelism` batches per node at once, rather than
    # that many across all nodes; False in histories recorded before.
    window_per_node: bool = False
    # A pass of a coded tier's copy stage; None for every other stage (and before).
    stripes: StripePhase | None = None
    # With `stripes`: each source node's stripe holders (`LifecyclePlan.stripe_holders`).
    stripe_holders: dict[str, list[str]] = Field(default_factory=dict)


class StageResult(BaseModel):
    batches: int
    failures: int = 0
    first_failure: str | None = None
    source_damaged: int = 0  # the sum of its batches' BatchResult.source_damaged
