"""Response schemas of the checkpoint endpoints (`...Out`); the request body is the manifest."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.timeline import CheckpointRefOut, HealthOut
from tierpoint.manifest import Manifest, ShardSpec
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierKind

# The request body is the manifest model shared with the CLI.
RegisterCheckpoint = Manifest
ShardIn = ShardSpec


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ProgressOut(_Out):
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int


class CodedCoverageOut(_Out):
    """A coded copy's sets (one per shard), counted over the stripes verified on holders not
    declared lost."""

    code: str = Field(description="the code the tier cuts files with, e.g. `rs(8,2)`")
    sets: int = Field(description="the checkpoint's sets: one per shard")
    whole: int = Field(description="sets with all k+m stripes verified")
    degraded: int = Field(
        description="sets with k or more verified stripes but not all k+m: still decodable"
    )
    stripes_short: int = Field(description="stripes missing from the degraded sets, in total")
    below_k: int = Field(description="sets with fewer than k verified stripes: no restore decodes")
    least_margin: int | None = Field(
        description="the fewest verified stripes of a set minus k: how many more lost stripes "
        "the weakest set survives (m when whole, negative below k; null without shards)"
    )


class TierStatusOut(_Out):
    tier: str
    kind: TierKind | None = Field(description="null for a tier no longer configured")
    state: TierState
    reason: str | None
    quarantine_reason: str | None
    restorable_at: datetime | None
    progress: ProgressOut = Field(
        description="on a coded peer tier not restorable, `shards_verified` counts whole sets"
    )
    coverage: CodedCoverageOut | None = Field(
        default=None, description="a coded peer tier's copy: its sets' standing; null otherwise"
    )


class CheckpointOut(_Out):
    job: str
    step: int
    created_at: datetime
    metadata: dict[str, Any]
    pinned: bool
    quarantine_reason: str | None
    total_bytes: int
    shard_count: int
    workflow_started: bool = Field(
        description="false until a lifecycle workflow is known to run (the API starts it right "
        "after registration, the reconciler catches up if Temporal was unreachable)"
    )
    tiers: list[TierStatusOut]
    deleted_at: datetime | None = Field(
        default=None,
        description="when an admin deleted it (its copies go through expiry; latest never "
        "offers it); null: not deleted",
    )
    id: int | None = Field(default=None, description="the checkpoint's id in the catalog")
    branch: int = Field(default=1, description="the branch of the job it was saved on")
    superseded_by: int | None = Field(
        default=None,
        description="the branch whose rollback superseded it (still listed and restorable by "
        "branch, never latest); null: on the job's timeline",
    )
    health: HealthOut | None = Field(
        default=None, description="its health verdict; null: none given"
    )
    parent: CheckpointRefOut | None = Field(
        default=None,
        description="the checkpoint the run had loaded before writing it (across branches and "
        "jobs); null: a root",
    )
    provenance: dict[str, Any] | None = Field(
        default=None, description="config hash, code version, data cursor, as registered"
    )


_LOCATION = (
    "where the copy is, for people to read: an absolute path on that node/tier, or "
    "s3://bucket/key with the key's characters as they are. Not a URL: do not parse it (a shard "
    "path may hold '?', '#', '%', ...); read S3 copies by `bucket` and `key`, POSIX copies by this "
    "path"
)
_BUCKET = "S3 copies: the bucket of the object; null on POSIX tiers"
_KEY = "S3 copies: the object's key, exactly (no URL encoding); null on POSIX tiers"
_URL = (
    "peer copies: where the holding node's data endpoint serves the file (the shard path "
    "percent-encoded once; a bearer credential is required); null on other tiers"
)


class ReplicaOut(_Out):
    tier: str
    node: str | None
    state: ReplicaState
    location: str = Field(description=_LOCATION)
    bucket: str | None = Field(default=None, description=_BUCKET)
    key: str | None = Field(default=None, description=_KEY)
    url: str | None = Field(default=None, description=_URL)
    bytes_done: int
    verified_at: datetime | None
    error: str | None
    scrubbed_at: datetime | None = Field(
        default=None, description="when a scrub last read this replica back and found it good"
    )


class ShardOut(_Out):
    path: str
    size: int
    crc32c: str | None
    node: str
    replicas: list[ReplicaOut]


class CheckpointDetailOut(CheckpointOut):
    shards: list[ShardOut] | None = Field(
        default=None, description="omitted (null) when requested with shards=false"
    )


class CheckpointPage(BaseModel):
    items: list[CheckpointOut]
    next_cursor: str | None = Field(
        description="pass as cursor= for the next page; null at the end"
    )


class PlanStripeOut(_Out):
    index: int = Field(description="the stripe's index in its set: data stripes first (0..k-1)")
    node: str = Field(description="the holder")
    url: str = Field(description="where the holder's data endpoint serves it")
    size: int
    crc32c: str = Field(description="the encoder's; a stripe that does not match is not used")


class RestorePlanEntryOut(_Out):
    path: str
    size: int
    crc32c: str | None
    tier: str
    kind: TierKind
    node: str | None = Field(description="the node holding a node-local or peer copy, else null")
    location: str = Field(description=_LOCATION)
    bucket: str | None = Field(default=None, description=_BUCKET)
    key: str | None = Field(default=None, description=_KEY)
    url: str | None = Field(default=None, description=_URL)
    code: str | None = Field(
        default=None,
        description='a coded peer copy: its code ("rs(k,m)"); any k of `stripes` give the file '
        "back, checked against `size` and `crc32c` before a byte is handed on",
    )
    stripes: list[PlanStripeOut] | None = Field(
        default=None,
        description="a coded peer copy: the stripes verified on holders not declared lost, at "
        "least k of them",
    )


class SkippedOut(_Out):
    step: int
    reasons: list[str]


class LatestRestorableOut(_Out):
    job: str
    step: int
    checkpoint: CheckpointOut
    plan: list[RestorePlanEntryOut]
    skipped: list[SkippedOut] = Field(description="every newer step, and why it was not chosen")
    fork_parent: bool = Field(
        default=False,
        description="true: the job asked about has no restorable checkpoint of its own yet, and "
        "this is the checkpoint it was forked from (of the job named in `job`), read where it is",
    )


class StripeOut(_Out):
    index: int = Field(description="the stripe's index in its set: data stripes first (0..k-1)")
    node: str = Field(description="the holder")
    holder_lost: bool = Field(
        description="the holder is declared lost: the stripe no longer counts, whatever `state`"
    )
    state: ReplicaState = Field(
        description="verified stripes on holders not lost count towards the set; `corrupt`: "
        "found bad (a scrub, or a reader's report its holder confirmed by reading it back)"
    )
    size: int
    crc32c: str = Field(description="the encoder's; a stripe that does not match is not used")
    verified_at: datetime | None
    scrubbed_at: datetime | None = Field(
        default=None, description="when the holder last read it back and found it good"
    )
    error: str | None


class ShardStripesOut(_Out):
    path: str
    size: int
    node: str = Field(description="the node that wrote the shard")
    code: str | None = Field(
        description='the code its set was cut with ("rs(k,m)"); null while it has no stripes'
    )
    stripes: list[StripeOut] = Field(description="by index; an index with no row is not held")


class ShardStripesPage(BaseModel):
    items: list[ShardStripesOut] = Field(description="shards in the manifest's order")
    next_cursor: str | None = Field(
        description="pass as cursor= for the next page; null at the end"
    )
