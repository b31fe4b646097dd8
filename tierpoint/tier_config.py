"""A tier's configuration: what kind of storage it is, where it lives and how it is written.

A tier is configuration, not code: `Settings.tiers` orders them from the fastest, most local one
to the most durable one. A field that applies to one kind of tier only says so in its description
("S3 tiers: ..."); the S3 options a POSIX tier must not set are listed in `S3_ONLY`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, PositiveInt, field_validator, model_validator
from tierpoint_client.erasure import Code, InvalidCodeError, parse_code
from tierpoint_client.paths import NAME_PATTERN

# The name rule is the training-side client's (one statement of it): a name the client accepts
# is one the server accepts.
NAME_RE = re.compile(NAME_PATTERN)
TAG_RE = re.compile(r"^[\w\s.:/=+\-@]*$")


# Options that only an S3 tier may set; a POSIX tier that sets one is refused at start.
S3_ONLY = (
    "storage_class",
    "sse",
    "kms_key_id",
    "bucket_key",
    "tags",
    "retry_mode",
    "max_attempts",
    "key_layout",
    "key_prefixes",
    "credentials_profile",
    "credentials_env",
)
ENV_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TierKind(StrEnum):
    LOCAL = "local"
    SHARED = "shared"
    S3 = "s3"
    # Each node's local-tier copies held on another node's own storage, pulled over the nodes'
    # data endpoints: the copy a replacement node restores from when a node is lost.
    PEER = "peer"


class RetryMode(StrEnum):
    """botocore's retry modes an S3 tier may use (not `legacy`, which retries less of what S3
    answers when busy)."""

    STANDARD = "standard"
    ADAPTIVE = "adaptive"


class KeyLayoutKind(StrEnum):
    """How an S3 tier lays out a checkpoint's keys (`tierpoint/storage/s3/layout.py`)."""

    FLAT = "flat"
    SPREAD = "spread"


class StorageClass(StrEnum):
    """S3 storage classes. GLACIER and DEEP_ARCHIVE objects must be restored (a RestoreObject
    request, minutes to hours) before they can be read."""

    STANDARD = "STANDARD"
    INTELLIGENT_TIERING = "INTELLIGENT_TIERING"
    STANDARD_IA = "STANDARD_IA"
    ONEZONE_IA = "ONEZONE_IA"
    GLACIER_IR = "GLACIER_IR"
    GLACIER = "GLACIER"
    DEEP_ARCHIVE = "DEEP_ARCHIVE"

    @property
    def needs_restore_request(self) -> bool:
        return self in (StorageClass.GLACIER, StorageClass.DEEP_ARCHIVE)


class PageCachePolicy(StrEnum):
    """What a copy reading a POSIX tier's file leaves in the node's page cache
    (docs/architecture.md, "The page cache")."""

    KEEP_NEWEST = "keep_newest"
    DROP = "drop"


class ServerSideEncryption(StrEnum):
    AES256 = "AES256"
    KMS = "aws:kms"


class TierConfig(BaseModel):
    name: str = Field(
        description="The tier's name, URL-safe (`[A-Za-z0-9][A-Za-z0-9._-]{0,127}`), unique."
    )
    kind: TierKind = Field(
        description="`local` (per node), `peer` (each node's local copies held by another "
        "node), `shared` (one POSIX root every node sees) or `s3`."
    )
    root: str | None = Field(
        default=None,
        description="POSIX tiers: the root directory. A local or peer root may contain "
        "`{node}`, replaced by the node id, so that one config serves every node (a peer "
        "root is on the node that holds the copies).",
    )
    bucket: str | None = Field(default=None, description="S3 tiers: the bucket (required).")
    prefix: str = Field(default="", description="S3 tiers: the key prefix of every object.")
    endpoint_url: str | None = Field(
        default=None,
        description="S3 tiers: an S3-compatible endpoint (MinIO, moto); unset for AWS S3.",
    )
    region: str = Field(default="us-east-1", description="S3 tiers: the bucket's region.")
    credentials_profile: str | None = Field(
        default=None,
        description="S3 tiers: sign with this named profile of the AWS config and credentials "
        'files instead of the standard AWS chain (docs/deployment.md, "Credentials per '
        'tier").',
    )
    credentials_env: str | None = Field(
        default=None,
        description="S3 tiers: sign with the keys in `<PREFIX>_ACCESS_KEY_ID`, "
        "`<PREFIX>_SECRET_ACCESS_KEY` and, when set, `<PREFIX>_SESSION_TOKEN` of the "
        "environment instead of the standard AWS chain, so that a process reaching two S3 "
        "endpoints gives each its own keys. A tier whose variables are missing fails; it never "
        "falls back to the chain.",
    )
    key_layout: KeyLayoutKind = Field(
        default=KeyLayoutKind.FLAT,
        description="S3 tiers: how a checkpoint's keys are laid out. `flat`: `<prefix><job>/"
        "<step>/<path>`, one prefix per checkpoint. `spread`: `<prefix>_<h>/<job>/<step>/<path>`, "
        "`h` a hash of the shard over `key_prefixes` prefixes, which S3 partitions apart (each "
        "takes 3,500 PUT and 5,500 GET requests/s). Recorded per checkpoint when its copy is "
        "planned: changing it moves only later checkpoints (docs/scale.md).",
    )
    key_prefixes: int = Field(
        default=16,
        ge=2,
        le=256,
        description='S3 tiers with `key_layout = "spread"`: how many prefixes a checkpoint\'s '
        "shards are spread over.",
    )
    storage_class: StorageClass = Field(
        default=StorageClass.STANDARD,
        description="S3 tiers: the storage class of every object written. GLACIER and "
        "DEEP_ARCHIVE objects are never offered as a restore source (they need a restore "
        "request first).",
    )
    sse: ServerSideEncryption | None = Field(
        default=None,
        description="S3 tiers: server-side encryption of every object written, `AES256` "
        "(SSE-S3) or `aws:kms` (SSE-KMS); unset = the bucket's default encryption.",
    )
    kms_key_id: str | None = Field(
        default=None,
        description='S3 tiers with `sse = "aws:kms"`: the KMS key (id, ARN or alias); unset = '
        "the AWS managed key.",
    )
    bucket_key: bool = Field(
        default=False,
        description='S3 tiers with `sse = "aws:kms"`: use an S3 Bucket Key (fewer KMS '
        "requests, lower KMS cost).",
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="S3 tiers: object tags set on every object written (e.g. for lifecycle "
        "rules or cost allocation).",
    )
    price_per_gb_month: float | None = Field(
        default=None,
        ge=0,
        description="What a GB (2^30 bytes) stored on this tier costs per month, in US dollars; "
        "unset = the default of its kind and storage class (docs/cost.md). Never fetched from "
        "the network.",
    )
    multipart_part_size: PositiveInt = Field(
        default=16 * 1024 * 1024,
        description="S3 tiers: bytes per part of a multipart upload; objects up to one part "
        "are a single PutObject.",
    )
    multipart_concurrency: PositiveInt = Field(
        default=2, description="S3 tiers: parts of one object uploaded at once."
    )
    retry_mode: RetryMode = Field(
        default=RetryMode.STANDARD,
        description="S3 tiers: botocore's retry mode for every request; `adaptive` also slows "
        "each worker's request rate while S3 answers 503 SlowDown (docs/scale.md).",
    )
    max_attempts: PositiveInt = Field(
        default=6,
        description="S3 tiers: attempts of one request, the first included (as "
        "`AWS_MAX_ATTEMPTS`), before its error fails the copy attempt, which Temporal retries.",
    )
    parallelism: PositiveInt = Field(
        default=4, description="How many shard batches copy to this tier at once."
    )
    read_bandwidth_limit: int = Field(
        default=0,
        ge=0,
        description="Reads off a local tier are throttled so that copies do not starve "
        "training (bytes/s, 0 = off).",
    )
    page_cache: PageCachePolicy = Field(
        default=PageCachePolicy.KEEP_NEWEST,
        description="POSIX tiers: what a copy reading a file off this tier leaves in the page "
        "cache. `keep_newest`: the file's pages stay, so a restart right after the checkpoint "
        "reads it from memory, and the same file's pages in the job's older checkpoints on "
        "this tier are dropped, so the cache holds about one checkpoint. `drop`: the pages are "
        "dropped behind the reader; the memory stays free, a restart reads from the device.",
    )
    scrub_bandwidth: int = Field(
        default=50 * 1024 * 1024,
        ge=0,
        description="Bytes/s the scrub reads back from this tier (per node for a local tier); "
        "0 = this tier is not scrubbed. See docs/integrity.md for what it costs per day.",
    )
    copies: PositiveInt = Field(
        default=1,
        description="Peer tiers: how many copies of each node's local-tier files, each on "
        "another node (K distinct nodes while more than K are serving, in distinct failure "
        "domains while there are that many). A peer tier with `copies = K` stands for K peer "
        "tiers, one per copy, right after it in the list: this one, then `<name>.2` ... "
        "`<name>.K` rooted at `<root>.2` ... `<root>.K`, each a tier of its own (tier copy, "
        "placement, scrub, re-replication); a retention rule for `<name>` applies to them "
        "unless one names them. Other kinds: 1.",
    )
    code: str | None = Field(
        default=None,
        description='Peer tiers: keep erasure-coded stripes instead of copies, e.g. "rs(8,2)": '
        "each of a node's local-tier files cut into k data and m parity stripes on k+m other "
        "nodes (in distinct failure domains while there are that many), any k of which give "
        "the file back; (k+m)/k of the files' bytes on the holders instead of K times. k >= 2, "
        "m >= 1, k+m <= 32. Needs k+m+1 nodes (the API and the shared worker refuse to start "
        "with a code the cluster cannot place); `copies` (above 1) or `code`, not both. A "
        "restore reads any k stripes from their holders, and a node declared lost has its "
        "stripes rebuilt on live nodes from k others (docs/architecture.md, the coded peer "
        "tier).",
    )
    copy_of: str | None = Field(
        default=None,
        description="Set by the settings, not in a configuration: on copies 2..K of a peer "
        "tier with `copies = K`, that tier's name (a dumped tier list repeats it and loads "
        "the same).",
    )
    copy_number: PositiveInt = Field(
        default=1,
        description="Set by the settings with `copy_of`: which copy of its peer tier this "
        "tier holds, 2..K (1: the configured tier itself).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("tier names are URL-safe: [A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        return v

    @field_validator("code")
    @classmethod
    def _code(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            # One spelling in every dump and every process: rs(k,m).
            return str(parse_code(v))
        except InvalidCodeError as e:
            raise ValueError(str(e)) from None

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        # S3's own limits, checked here so that a bad tag fails at start, not at the first upload.
        if len(tags) > 10:
            raise ValueError("S3 allows at most 10 tags per object")
        for k, v in tags.items():
            if not 1 <= len(k) <= 128 or len(v) > 256:
                raise ValueError(f"tag {k!r}: keys are 1-128 characters, values up to 256")
            if not (TAG_RE.match(k) and TAG_RE.match(v)):
                raise ValueError(
                    f"tag {k!r}={v!r}: S3 allows letters, digits, spaces and _ . : / = + - @"
                )
        return tags

    @model_validator(mode="after")
    def _location(self) -> Self:
        if self.kind is TierKind.S3:
            if not self.bucket:
                raise ValueError(f"s3 tier {self.name!r} needs a bucket")
        elif not self.root:
            raise ValueError(f"{self.kind} tier {self.name!r} needs a root")
        if self.kind is not TierKind.S3:
            # Set to something else than the default (a dumped config repeats the defaults).
            given = [
                f
                for f in S3_ONLY
                if getattr(self, f)
                != type(self).model_fields[f].get_default(call_default_factory=True)
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: S3 tiers only, {self.name!r} is {self.kind}")
        if self.kind is not TierKind.PEER and self.copies != 1:
            raise ValueError(
                f"copies: peer tiers only, {self.name!r} is {self.kind} (a local tier is one "
                "copy per node; copies on other nodes are a peer tier after it)"
            )
        if self.code is not None and self.kind is not TierKind.PEER:
            raise ValueError(
                f"code: peer tiers only, {self.name!r} is {self.kind} (stripes are held by "
                "other nodes)"
            )
        if self.code is not None and self.copies != 1:
            raise ValueError(
                f"peer tier {self.name!r}: copies = {self.copies} or code = {self.code!r}, not "
                "both (a code already survives the loss of m holders)"
            )
        if (self.copy_of is None) != (self.copy_number == 1) or not (
            self.copy_number <= self.copies
        ):
            raise ValueError(
                f"tier {self.name!r}: copy_of and copy_number are set by the settings on the "
                "copies of a peer tier with `copies`; leave them out"
            )
        if self.credentials_profile and self.credentials_env:
            raise ValueError(
                f"tier {self.name!r}: credentials_profile or credentials_env, not both"
            )
        if self.credentials_env is not None and not ENV_PREFIX_RE.match(self.credentials_env):
            raise ValueError(
                f"tier {self.name!r}: credentials_env is the prefix of environment variables "
                f"(letters, digits and _), not {self.credentials_env!r}"
            )
        if self.sse is not ServerSideEncryption.KMS and (self.kms_key_id or self.bucket_key):
            raise ValueError(f'tier {self.name!r}: kms_key_id and bucket_key need sse = "aws:kms"')
        return self

    @property
    def stripe_code(self) -> Code | None:
        """The code of a peer tier that keeps stripes; None for one that keeps copies."""
        return parse_code(self.code) if self.code is not None else None

    @property
    def needs_restore_request(self) -> bool:
        """Objects on this tier cannot be read without an S3 restore request first."""
        return self.kind is TierKind.S3 and self.storage_class.needs_restore_request

    @property
    def configured_name(self) -> str:
        """The name of the configured tier this one comes from: itself, or for copies 2..K of
        a peer tier with `copies = K`, that tier."""
        return self.copy_of or self.name

    @property
    def on_nodes(self) -> bool:
        """Its copies live on the nodes' own storage: only a node's own worker reaches them."""
        return self.kind in (TierKind.LOCAL, TierKind.PEER)

    def root_for(self, node_id: str | None) -> Path:
        assert self.root is not None
        if self.on_nodes:
            if node_id is None:
                raise ValueError(f"{self.kind} tier {self.name!r} is per node: a node id is needed")
            return Path(self.root.replace("{node}", node_id))
        return Path(self.root)
