"""A DCP checkpoint's files in tierpoint, as its writer and reader both name them (no torch
needed): where a rank's files go (this node, its local tier), what each stored item records, and
the checkpoint id DCP is given."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tierpoint_client.errors import TierpointError
from tierpoint_client.models import TierInfo
from tierpoint_client.paths import NAME_BODY

# This node's id, as its tierpoint node worker knows it (`tierpoint worker --node N`).
NODE_ENV = "TIERPOINT_NODE"
# DCP's global metadata file; registered as a shard of the checkpoint like every data file.
METADATA_FILE = ".metadata"
SCHEME = "tierpoint://"
_ID = re.compile(rf"^tierpoint://(?P<job>{NAME_BODY})(?:/(?P<step>\d+))?/?$")


@dataclass(frozen=True)
class TierpointStorageInfo:
    """One stored item, as DCP keeps it in `Metadata.storage_data` (pickled into `.metadata`).

    `path` is relative to the checkpoint directory on every tier; `file_size` and `crc32c` are the
    whole file's, as registered, so a reader can verify any copy of it. `item_crc32c` is the crc32c
    of the item's own `length` bytes: a reader that fetches only some items of a file verifies
    each against it (None in checkpoints written before it existed: those are read whole).
    """

    path: str
    offset: int
    length: int
    node: str
    file_size: int
    crc32c: str
    item_crc32c: str | None = None


def parse_checkpoint_id(checkpoint_id: object) -> tuple[str, int | None] | None:
    """(job, step) of `tierpoint://<job>[/<step>]`, else None."""
    if not isinstance(checkpoint_id, str):
        return None
    m = _ID.match(checkpoint_id)
    if m is None:
        return None
    return m["job"], int(m["step"]) if m["step"] is not None else None


def resolve_node(node: str | None, *, required: bool) -> str | None:
    found = node or os.environ.get(NODE_ENV) or None
    if found is None and required:
        raise TierpointError(
            f"this node's id is unknown: pass node= or set {NODE_ENV} (the id its tierpoint "
            "node worker reports)"
        )
    return found


def local_tier(tiers: Sequence[TierInfo]) -> TierInfo | None:
    """The tier checkpoints are written to: the first local tier of the server's config."""
    return next((t for t in tiers if t.kind == "local" and t.root), None)
