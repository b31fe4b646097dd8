"""Shard path and job name rules: the one statement of them. The server validates manifests and
names with this module too (tierpoint.storage.paths), so a bad path or job name fails before any
request with the server's own reason, nothing is written under a name the server would refuse,
and a restore plan can never write outside its destination directory.

A shard path is the bytes of a POSIX name, carried as text: every character below is kept as it
is, never normalised (NFC and NFD spellings are two names) and never decoded (`%41` is three
characters, not `A`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from tierpoint_client.errors import InvalidJobNameError, ManifestError, UnsafePathError

# Job names (tier and policy names too) are a URL path segment, a directory name and a part of an
# S3 key as they are: nothing to escape anywhere, nothing that leaves a directory.
NAME_BODY = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
NAME_PATTERN = f"^{NAME_BODY}$"
NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(NAME_BODY)
# A refused name is quoted up to this many characters.
_SHOWN_CHARS = 40

# S3 keys are at most 1024 bytes: leave room for the tier prefix, the job name and the step.
MAX_PATH_BYTES = 768
MAX_PART_BYTES = 255
# Temporary files end with this; shard names may not, so they never collide.
PARTIAL_SUFFIX = ".tierpoint-partial"
# A file a delete has renamed aside to check it ends with this (the server's POSIX tiers): shard
# names may not either, so a delete never takes a shard for a file it moved aside.
ASIDE_SUFFIX = ".tierpoint-deleting"
RESERVED_SUFFIXES = (PARTIAL_SUFFIX, ASIDE_SUFFIX)


def validate_relative_path(path: str) -> str:
    """Return `path` unchanged if it is a safe relative shard path, else raise UnsafePathError.

    Accepted paths are canonical: '/'-separated non-empty components, none of them '.' or '..',
    no backslashes, NUL or control characters, valid UTF-8, bounded length.
    """
    if not isinstance(path, str) or path == "":
        raise UnsafePathError("shard path is empty")
    # guard: paths-absolute
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
        # guard: paths-dotdot
        if part in (".", ".."):
            raise UnsafePathError(f"shard path {path!r} has a {part!r} component")
        if part.endswith(RESERVED_SUFFIXES):
            raise UnsafePathError(
                f"shard path {path!r}: names ending in {PARTIAL_SUFFIX!r} or "
                f"{ASIDE_SUFFIX!r} are reserved"
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
            # guard: paths-file-above-file
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


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def name_error(what: str, name: object) -> str:
    """Why `name` is refused as a `what` ("job name"), in words: the rule, not its regex."""
    shown = repr(name)
    if isinstance(name, str) and len(name) > _SHOWN_CHARS:
        shown = f"{name[:_SHOWN_CHARS]!r}... ({len(name)} characters)"
    return f"{what} {shown} is not valid: a {what} is {NAME_RULE}"


def validate_job_name(job: str) -> str:
    """Return `job` unchanged if it is a valid job name, else raise InvalidJobNameError."""
    if not is_valid_name(job):
        raise InvalidJobNameError(name_error("job name", job))
    return job
