"""The deployment's size limits on a manifest (Settings): checked after the manifest parsed, which
says only whether it is valid anywhere, and before anything is written (invariant 6)."""

from __future__ import annotations

import json
from typing import Any

from tierpoint.errors import ManifestTooLarge
from tierpoint.manifest import Manifest


def check_limits(manifest: Manifest, *, max_shards: int, max_metadata_bytes: int) -> None:
    """The deployment's size limits (Settings), checked after the manifest parsed and before
    anything is written."""
    if len(manifest.shards) > max_shards:
        raise ManifestTooLarge(
            f"the manifest has {len(manifest.shards)} shards; the limit is {max_shards}",
            errors=[_limit_error("shards", f"more than {max_shards} shards")],
        )
    size = metadata_bytes(manifest.metadata)
    if manifest.provenance is not None:
        size += metadata_bytes(manifest.provenance.model_dump(exclude_none=True))
    # guard: metadata-limit
    if size > max_metadata_bytes:
        raise ManifestTooLarge(
            f"metadata is {size} bytes as JSON; the limit is {max_metadata_bytes} bytes "
            "(keep large data in the checkpoint's files)",
            errors=[_limit_error("metadata", f"{size} bytes, over {max_metadata_bytes}")],
        )


def metadata_bytes(metadata: dict[str, Any]) -> int:
    """Size of the metadata as stored: compact JSON, UTF-8."""
    return len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())


def _limit_error(field: str, message: str) -> dict[str, str]:
    return {"field": field, "location": "body", "message": message, "code": "too_large"}
