"""Shard path rules, the same the server enforces, so bad paths fail before any request and a
restore plan can never write outside its destination directory."""

from __future__ import annotations

import os
from pathlib import Path

from tierpoint_client.errors import UnsafePathError

# The server's limits: S3 keys are at most 1024 bytes, and the tier prefix, job and step need room.
MAX_PATH_BYTES = 768
MAX_PART_BYTES = 255
# Temporary files end with this; the server refuses shard names that do, so they never collide.
PARTIAL_SUFFIX = ".tierpoint-partial"


def validate_relative_path(path: str) -> str:
    """Return `path` if it is a clean relative POSIX path, else raise UnsafePathError."""
    if not isinstance(path, str) or path == "":
        raise UnsafePathError("shard path is empty")
    if path.startswith("/"):
        raise UnsafePathError(
            f"shard path {path!r} is absolute; paths are relative to the checkpoint"
        )
    if "\\" in path:
        raise UnsafePathError(f"shard path {path!r} contains a backslash; use '/' separators")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise UnsafePathError(f"shard path {path!r} contains NUL or control characters")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePathError(f"shard path {path!r} is not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise UnsafePathError(f"shard path is {len(encoded)} bytes; the limit is {MAX_PATH_BYTES}")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePathError(
                f"shard path {path!r} has an empty, '.' or '..' component; it must stay inside "
                "the checkpoint directory"
            )
        if part.endswith(PARTIAL_SUFFIX):
            raise UnsafePathError(
                f"shard path {path!r}: names ending in {PARTIAL_SUFFIX!r} are reserved"
            )
        if len(part.encode("utf-8")) > MAX_PART_BYTES:
            raise UnsafePathError(
                f"shard path {path!r} has a component over {MAX_PART_BYTES} bytes"
            )
    return path


def safe_join(root: str | os.PathLike[str], path: str) -> Path:
    """`root/path`, refusing anything that would resolve outside root.

    Besides the lexical rules, already existing directories under root are resolved, so a symlink
    planted in the destination cannot redirect a write elsewhere.
    """
    validate_relative_path(path)
    base = Path(os.path.realpath(root))
    target = base.joinpath(*path.split("/"))
    # Resolve what exists of the parent chain; the file itself is created by us.
    parent = Path(os.path.realpath(target.parent))
    if parent != base and base not in parent.parents:
        raise UnsafePathError(f"shard path {path!r} resolves outside {os.fspath(root)!r}")
    if target.is_symlink():
        raise UnsafePathError(f"{path!r} is a symlink in the destination; refusing to write it")
    return parent / target.name
