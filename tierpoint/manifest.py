"""The checkpoint manifest a training job registers, and every check it must pass before anything
is written (invariant 6). Shared by the API (request body) and the CLI.

Each failed check is a pydantic error whose `type` is a stable code (`unsafe_path`,
`invalid_crc32c`, ...), so the API can name the field and pick the problem code without parsing
messages.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic_core import PydanticCustomError
from tierpoint_client.paths import NAME_PATTERN

from tierpoint.errors import UnsafePath
from tierpoint.json_types import NO_NUL, JsonInt, text_value
from tierpoint.storage.checksum import crc32c_hex, parse_crc32c
from tierpoint.storage.paths import (
    MAX_PATH_BYTES,
    path_conflict,
    path_conflict_message,
    validate_relative_path,
)
from tierpoint.storage.paths import MAX_STEP as MAX_STEP  # the API's bound on steps too

# Branches of one job are numbered from 1; a rollback adds one (a Postgres integer).
MAX_BRANCH = 2**31 - 1
_TEXT = r"^[^\x00-\x1f\x7f]+$"

# Columns are BIGINT.
MAX_INT64 = 2**63 - 1
# Sizes too: a shard's and a checkpoint's total (8 PiB, far above any file a tier holds). The
# catalog counts them in BIGINT columns (a checkpoint's total) and numeric running totals (a
# job's usage per tier, summed over any number of checkpoints), the views and metrics as JSON
# numbers and doubles: every one of them holds any sum of accepted sizes exactly.
MAX_BYTES = 2**53 - 1


def step_in_range(value: int) -> int:
    """A step the API accepts (0 <= step <= 2^53 - 1), else the stable `step_out_of_range`."""
    if value > MAX_STEP:
        raise PydanticCustomError(
            "step_out_of_range",
            "step must be at most 2^53-1 = {max} (the largest integer every JSON reader, "
            "JavaScript included, holds exactly)",
            {"max": MAX_STEP},
        )
    return value


def size_in_range(value: int) -> int:
    """A shard size the API accepts (at most MAX_BYTES), else the stable `size_out_of_range`."""
    if value > MAX_BYTES:
        raise PydanticCustomError(
            "size_out_of_range",
            "size must be at most 2^53-1 = {max} bytes (what the catalog's totals and every "
            "JSON reader count exactly)",
            {"max": MAX_BYTES},
        )
    return value


def _total_in_range(shards: Sequence[ShardSpec]) -> None:
    total = sum(s.size for s in shards)
    if total > MAX_BYTES:
        raise PydanticCustomError(
            "total_size_too_large",
            "the shards add up to {total} bytes; a checkpoint holds at most 2^53-1 = {max} bytes",
            {"total": total, "max": MAX_BYTES},
        )


# In the schema as minimum/maximum; the validator gives a refusal its own code.
StepInt = Annotated[
    JsonInt,
    Field(ge=0, json_schema_extra={"maximum": MAX_STEP}),
    AfterValidator(step_in_range),
]
MAX_METADATA_DEPTH = 32
MAX_METADATA_NUMBER = 10**30
# What a metadata value may be, as the API's schema of the manifest says it (api/openapi.py puts it
# in the components); _json_value is the judge, and also bounds the depth.
METADATA_VALUE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": "number", "minimum": -1e30, "maximum": 1e30},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": "#/components/schemas/MetadataValue"}},
        {
            "type": "object",
            "additionalProperties": {"$ref": "#/components/schemas/MetadataValue"},
            "propertyNames": {"pattern": NO_NUL},
        },
    ]
}


# A job registers the same shard paths at every step: remember the ones that passed (the model
# and the fast path of parsing, manifest_parse.py, both check each path through it).
valid_path = functools.lru_cache(maxsize=1 << 16)(validate_relative_path)


def _path(value: str) -> str:
    try:
        return valid_path(value)
    except UnsafePath as exc:
        raise PydanticCustomError("unsafe_path", str(exc)) from None


def _crc32c(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        # One spelling in the catalog, so that digests and comparisons do not depend on case.
        return crc32c_hex(parse_crc32c(value))
    except ValueError:
        raise PydanticCustomError(
            "invalid_crc32c", f"crc32c must be exactly 8 hex digits or null, got {value[:40]!r}"
        ) from None


def _json_value(value: Any, depth: int) -> None:
    if depth > MAX_METADATA_DEPTH:
        raise PydanticCustomError(
            "invalid_metadata", f"metadata nests deeper than {MAX_METADATA_DEPTH} levels"
        )
    if isinstance(value, str):
        text_value(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > float(MAX_METADATA_NUMBER):
            raise PydanticCustomError(
                "invalid_metadata", "metadata numbers must be finite and within ±1e30"
            )
    elif isinstance(value, int) and not isinstance(value, bool):
        # jsonb numerics are arbitrary precision, but keep them sane for every reader (and
        # within what Python turns into text).
        if abs(value) > MAX_METADATA_NUMBER:
            raise PydanticCustomError("invalid_metadata", "metadata integer out of range")
    elif isinstance(value, dict):
        for k, v in value.items():
            text_value(k)
            _json_value(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _json_value(v, depth + 1)


# validate_relative_path's lexical rules as a JSON-schema pattern, for clients and schema-driven
# tests (the validator stays the judge: it also bounds bytes per path and per component).
_CHAR = r"[^/\\\x00-\x1f\x7f]"
_NOT_DOT = r"[^./\\\x00-\x1f\x7f]"
# Components of at most 255 characters (the validator counts bytes: a schema cannot).
_COMPONENT = rf"(?:{_NOT_DOT}{_CHAR}{{0,254}}|\.{_NOT_DOT}{_CHAR}{{0,253}}|\.\.{_CHAR}{{1,253}})"
SHARD_PATH_PATTERN = rf"^{_COMPONENT}(?:/{_COMPONENT})*$"

ShardPath = Annotated[
    str,
    Field(
        strict=True,
        json_schema_extra={
            "pattern": SHARD_PATH_PATTERN,
            "minLength": 1,
            "maxLength": MAX_PATH_BYTES,
        },
    ),
    AfterValidator(_path),
]
SizeInt = Annotated[
    JsonInt,
    Field(ge=0, json_schema_extra={"maximum": MAX_BYTES}),
    AfterValidator(size_in_range),
]
NodeId = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=128, json_schema_extra={"pattern": NO_NUL}),
    AfterValidator(text_value),
]
Crc32c = Annotated[
    str | None,
    Field(strict=True, json_schema_extra={"pattern": "^[0-9A-Fa-f]{8}$"}),
    AfterValidator(_crc32c),
]


class ShardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: ShardPath = Field(description="Relative to the checkpoint directory, '/'-separated.")
    size: SizeInt = Field(description="Bytes, at most 2^53 - 1.")
    crc32c: Crc32c = Field(
        default=None, description="8 hex digits; null lets the seal stage compute it on the node."
    )
    node: NodeId = Field(description="The node whose local tier holds the shard.")


class ParentRef(BaseModel):
    """A checkpoint named across jobs and branches: a registration's parent, a fork's origin."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: str = Field(pattern=NAME_PATTERN)
    step: StepInt
    branch: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BRANCH,
        description="null: the step as the job's timeline sees it (the checkpoint at that step "
        "that is not superseded, else the newest one)",
    )


class Provenance(BaseModel):
    """Where a checkpoint came from, beside its metadata (every field optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    config_hash: str | None = Field(default=None, min_length=1, max_length=256, pattern=_TEXT)
    code_version: str | None = Field(default=None, min_length=1, max_length=256, pattern=_TEXT)
    data_cursor: Any = Field(default=None, description="Where the data loader was (any JSON).")

    @field_validator("data_cursor")
    @classmethod
    def _cursor(cls, value: Any) -> Any:
        _json_value(value, 1)
        return value


class Manifest(BaseModel):
    """Body of POST /v1/jobs/{job}/checkpoints."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "step": 1000,
                    "shards": [
                        {
                            "path": "model/rank0.pt",
                            "size": 1048576,
                            "crc32c": "e3069283",
                            "node": "node-a",
                        },
                    ],
                    "metadata": {"loss": 1.93},
                }
            ]
        },
    )

    step: StepInt
    # Paths are unique too (the validator says so; a JSON schema can only say it of whole items).
    shards: list[ShardSpec] = Field(min_length=1, json_schema_extra={"uniqueItems": True})
    metadata: dict[str, Any] = Field(default_factory=dict, strict=True)
    branch: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BRANCH,
        description="The branch the job saves on (what its rollback or its load answered). null: "
        "the job's current branch. A branch that is no longer current: 409 `branch_superseded` "
        "(a writer still running after a rollback cannot add to the timeline it left).",
    )
    parent: ParentRef | None = Field(
        default=None,
        description="The checkpoint the run had loaded before it wrote this one (another job's "
        "for a fork). null: the step before it on the job's timeline, else the job's fork parent.",
    )
    provenance: Provenance | None = None

    @field_validator("shards")
    @classmethod
    def _unique_paths(cls, shards: list[ShardSpec]) -> list[ShardSpec]:
        seen: dict[str, int] = {}
        for i, shard in enumerate(shards):
            first = seen.setdefault(shard.path, i)
            if first != i:
                raise PydanticCustomError(
                    "duplicate_path",
                    f"shard path {shard.path!r} appears twice (shards[{first}] and shards[{i}])",
                )
        clash = path_conflict(seen)
        if clash is not None:
            # A file and a directory of one name: no tier could hold both shards.
            raise PydanticCustomError("path_conflict", path_conflict_message(*clash))
        _total_in_range(shards)
        return shards

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        _json_value(metadata, 1)
        return metadata

    @functools.cached_property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)
