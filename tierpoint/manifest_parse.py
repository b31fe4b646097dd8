"""A manifest from a request body: a fast path for what almost every manifest is, and the
manifest model itself for whatever the fast path refuses, which alone says what is wrong."""

from __future__ import annotations

import operator

from pydantic import Field, ValidationError, field_validator

from tierpoint.errors import UnsafePath
from tierpoint.json_types import text_value
from tierpoint.manifest import MAX_BYTES, MAX_STEP, Manifest, ShardSpec, valid_path
from tierpoint.storage.paths import path_conflict

# The fast path of parsing a manifest: what almost every manifest is (integers as JSON integers,
# crc32c in lower case) checked by pydantic-core alone, and the per-shard checks that need Python
# done in one loop over all shards instead of a validator call per field. It refuses a superset
# of what Manifest refuses and yields the same values; whatever it refuses is validated again by
# Manifest, which alone says what is wrong (the errors and their codes).
_by_path = operator.attrgetter("path")


class _FastShard(ShardSpec):
    path: str = Field(strict=True)
    size: int = Field(strict=True, ge=0, le=MAX_BYTES)
    crc32c: str | None = Field(default=None, strict=True, pattern="^[0-9a-f]{8}$")
    node: str = Field(strict=True, min_length=1, max_length=128)


class _FastManifest(Manifest):
    step: int = Field(strict=True, ge=0, le=MAX_STEP)
    shards: list[_FastShard] = Field(min_length=1)  # type: ignore[assignment]

    @field_validator("shards")
    @classmethod
    def _unique_paths(cls, shards: list[ShardSpec]) -> list[ShardSpec]:
        paths = set(map(_by_path, shards))
        if len(paths) != len(shards):
            raise ValueError("duplicate paths")
        for path in paths:
            valid_path(path)  # raises UnsafePath
        if path_conflict(paths) is not None:
            raise ValueError("path conflict")
        for node in {s.node for s in shards}:
            text_value(node)
        if sum(s.size for s in shards) > MAX_BYTES:
            raise ValueError("total size")
        return shards


def parse_manifest_json(body: bytes | str) -> Manifest:
    """The manifest from a request body (JSON), validated; raises pydantic's ValidationError
    with Manifest's own errors."""
    try:
        return _FastManifest.model_validate_json(body)
    except (ValidationError, UnsafePath):
        return Manifest.model_validate_json(body)
