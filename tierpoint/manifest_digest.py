"""A manifest as bytes: the canonical form its digest is taken over (the same job, step and
digest register once, invariant 5), and the shards' JSON that registration stores."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Sequence

from pydantic import TypeAdapter

from tierpoint.manifest import ShardSpec


def canonical_shards(shards: Sequence[ShardSpec]) -> bytes:
    """The bytes the manifest digest is taken over: the shards sorted by path, nothing else, so
    metadata or shard order do not make a retried registration look different."""
    # A shard's __dict__ is exactly its four fields (extra="forbid"), so it serializes as the
    # dict {crc32c, node, path, size} would, without building one per shard.
    rows = [s.__dict__ for s in sorted(shards, key=_by_path)]
    return json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_by_path = operator.attrgetter("path")
_SHARDS = TypeAdapter(list[ShardSpec])


def shards_json(shards: Sequence[ShardSpec]) -> bytes:
    """The shards as a JSON array of objects (path, size, crc32c, node), serialized by
    pydantic-core in one call."""
    return _SHARDS.dump_json(list(shards))


def manifest_digest(shards: Sequence[ShardSpec]) -> str:
    return hashlib.sha256(canonical_shards(shards)).hexdigest()
