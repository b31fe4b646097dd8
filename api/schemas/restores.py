"""Bodies of the restore endpoint: what a restarting job asks once, and the one answer that says
which step, from where, under which lease."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas.checkpoints import CheckpointDetailOut, PlanStripeOut, SkippedOut
from api.schemas.leases import Lease, TtlSeconds
from api.schemas.tiers import TierOut
from tierpoint.json_types import JsonInt, Text
from tierpoint.manifest import MAX_BRANCH, StepInt

_NAME = r"^[^\x00-\x1f\x7f]+$"
ShardPath = Annotated[Text, Field(min_length=1, max_length=4096)]
# Bounds of one record of cached copies: the nodes of one load, and the files one node keeps.
MAX_CACHED_NODES = 100_000
MAX_CACHED_PER_NODE = 100_000


class StartRestore(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    step: StepInt | None = Field(
        default=None, description="The step to restore; absent: the latest restorable one."
    )
    branch: JsonInt | None = Field(
        default=None,
        ge=1,
        le=MAX_BRANCH,
        description="With `step`: the checkpoint saved at that step on this branch. Without: the "
        "newest of this branch's own timeline (superseded or not), as `latest?branch=` answers.",
    )
    health: Literal["good"] | None = Field(
        default=None,
        description="Without `step`: the newest checkpoint certified good, as "
        "`latest?health=good` answers.",
    )
    tier: Text | None = Field(
        default=None,
        description="Without `step`: choose the latest step restorable from this tier.",
    )
    node: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=_NAME,
        description="Without `step`: the caller's node, whose node-local copies then count.",
    )
    ttl_seconds: JsonInt = TtlSeconds
    owner: str | None = Field(
        default=None,
        validation_alias="holder",
        min_length=1,
        max_length=256,
        pattern=_NAME,
        description="Who takes the lease (free text, e.g. the restarting job and its size).",
    )

    @model_validator(mode="after")
    def _step_or_health(self) -> StartRestore:
        # A step names one checkpoint; "certified good" chooses one: asking both is ambiguous.
        if self.step is not None and self.health is not None:
            raise ValueError("give `step` (and `branch`) or `health`, not both")
        return self


class CodedFileOut(BaseModel):
    path: str
    stripes: list[PlanStripeOut] = Field(
        description="the stripes verified on holders not declared lost that serve an endpoint "
        "now, at least k of them"
    )


class CodedCopyOut(BaseModel):
    tier: str
    code: str = Field(description='its code ("rs(k,m)"): any k of a file\'s stripes give it back')
    files: list[CodedFileOut]


class RestoreOut(BaseModel):
    job: str = Field(
        description="the job whose checkpoint this is: a fork's first restore answers its "
        "parent's (`fork_parent`), whose files are the parent job's"
    )
    step: int
    branch: int = Field(description="the branch the checkpoint was saved on (its files' directory)")
    fork_parent: bool = Field(
        default=False,
        description="true: the job asked about has no restorable checkpoint of its own yet, and "
        "this is the checkpoint it was forked from (of the job named in `job`), read where it is",
    )
    lease: Lease = Field(description="held on the step until released or expired")
    checkpoint: CheckpointDetailOut = Field(
        description="the step with every shard and every copy of it: where each file can be read"
    )
    tiers: list[TierOut] = Field(description="the configured tiers, fastest first")
    skipped: list[SkippedOut] = Field(
        description="without `step`: every newer step, and why it was not chosen"
    )
    coded: list[CodedCopyOut] = Field(
        default_factory=list,
        description="the checkpoint's restorable coded copies (a coded peer tier keeps stripes, "
        "not replicas) as the restore plan offers them: per file, the stripes to read any k of. "
        "A coded copy short of k served stripes for some file is not listed",
    )


class NodeCachedCopies(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    node: str = Field(min_length=1, max_length=128, pattern=_NAME, description="the node")
    paths: list[ShardPath] = Field(
        min_length=1,
        max_length=MAX_CACHED_PER_NODE,
        description="registered paths of the checkpoint's files the node's readers keep there",
    )


class CachedCopiesIn(BaseModel):
    """The files a load's ranks will keep on their nodes' local tier, recorded before they are
    written: the copy's expiry on that tier deletes them with the node's own files."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tier: Text = Field(min_length=1, max_length=128, description="a local tier")
    copies: list[NodeCachedCopies] = Field(min_length=1, max_length=MAX_CACHED_NODES)


class CachedCopiesOut(BaseModel):
    tier: str
    copies: list[NodeCachedCopies] = Field(
        description="what was recorded, per node (a reader keeps only these): nothing for a node's "
        "own files, nor once the checkpoint's copy on the tier is being expired"
    )
