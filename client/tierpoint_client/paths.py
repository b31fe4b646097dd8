"""Shard path rules: the one statement of them. The server validates manifests with this module
too (tierpoint.storage.paths), so bad paths fail before any request with the server's own reason,
and a restore plan can never write outside its destination directory.

A shard path is the bytes of a POSIX name, carried as text: every character below is kept as it
is, never normalised (NFC and NFD spellings are two names) and never decoded (`%41` is three
characters, not `A`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tierpoint_client.errors import ManifestError, UnsafePathError

# S3 keys are at most 1024 bytes: leave room for the tier prefix, the job name and the step.
MAX_PATH_BYTES = 768
MAX_PART_BYTES = 255
# Temporary files end with this; shard names may not, so they never collide.
PARTIAL_SUFFIX = ".tierpoint-partial"


def validate_relative_path(path: str) -> str:
    """Return `path` unchanged if it is a safe relative shard path, else raise UnsafePathError.

    Accepted paths are canonical: '/'-separated non-empty components, none of them '.' or '..',
    no backslashes, NUL or control characters, valid UTF-8, bounded length.
    """
    if not isinstance(path, str) or path == "":
        raise UnsafePathError("shard path is empty")
    if path.startswith("/"):
        raise UnsafePathError(
            f"shard path {path!r} is absolute; paths are relative to the checkpoint"
        )
    if "\\" in path:
        raise UnsafePathError(f"shard path {path!r} contains a backslash; use '/' as separator")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise UnsafePathError(f"shard path {path!r} contains NUL or control characters")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePathError(f"shard path {path!r} is not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise UnsafePathError(
            f"shard path is {len(encoded)} bytes long; the limit is {MAX_PATH_BYTES}"
        )
    for part in path.split("/"):
        if part == "":
            raise UnsafePathError(
                f"shard path {path!r} has an empty component ('//' or trailing '/')"
            )
        if part in (".", ".."):
            raise UnsafePathError(f"shard path {path!r} has a {part!r} component")
        if part.endswith(PARTIAL_SUFFIX):
            raise UnsafePathError(
                f"shard path {path!r}: names ending in {PARTIAL_SUFFIX!r} are reserved"
            )
        if len(part.encode("utf-8")) > MAX_PART_BYTES:
            raise UnsafePathError(
                f"shard path {path!r} has a component over {MAX_PART_BYTES} bytes"
            )
    return path


def partial_name(name: str, tag: str = "") -> str:
    """The temporary name under which a file to be called `name` is written before its rename:
    `.<name>.<tag>.tierpoint-partial` (`tag` tells concurrent writers apart; without one,
    `.<name>.tierpoint-partial`, the server's stores' name), or, where that would pass the
    255 bytes of a name, the same with the name's sha256 in its place: every name the server
    accepts (up to MAX_PART_BYTES) has a temporary name."""
    middle = f".{tag}" if tag else ""
    candidate = f".{name}{middle}{PARTIAL_SUFFIX}"
    if len(candidate.encode("utf-8")) <= MAX_PART_BYTES:
        return candidate
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f".{digest}{middle}{PARTIAL_SUFFIX}"


def path_conflict(paths: Iterable[str]) -> tuple[str, str] | None:
    """Two of `paths` that cannot both be files, one naming a directory above the other (`a` and
    `a/b`), or None. Linear in the number of components."""
    listed = list(paths)
    every = set(listed)
    for path in listed:
        cut = path.find("/")
        while cut != -1:
            if path[:cut] in every:
                return path[:cut], path
            cut = path.find("/", cut + 1)
    return None


def check_no_path_conflict(paths: Iterable[str]) -> None:
    """Raise ManifestError if one path names a directory above another (`a` and `a/b`): the API
    refuses such a manifest (422 `invalid_manifest`, field code `path_conflict`)."""
    clash = path_conflict(paths)
    if clash is not None:
        raise ManifestError(path_conflict_message(*clash))


def path_conflict_message(file: str, below: str) -> str:
    return (
        f"shard paths {file!r} and {below!r} cannot both be files: the first would be a "
        "directory of the second"
    )


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
