"""Path confinement for tier roots (invariant 6: nothing outside a tier root is ever touched).

Shard paths come from manifests, i.e. from users. They are validated lexically here
(`validate_relative_path`); a POSIX tier then reaches them without following any symlink below its
root (`tierpoint.storage.posix.confined`), so a shard stays inside its own `<job>/<step>/`.
"""

from __future__ import annotations

import hashlib

from tierpoint.config import NAME_RE
from tierpoint.errors import UnsafePath

# S3 keys are at most 1024 bytes: leave room for the tier prefix, the job name and the step.
MAX_PATH_BYTES = 768
MAX_COMPONENT_BYTES = 255
# Temp files of copies in progress end with this; shard names may not, so they never collide.
PARTIAL_SUFFIX = ".tierpoint-partial"


def validate_relative_path(path: str) -> str:
    """Return `path` unchanged if it is a safe relative shard path, else raise UnsafePath.

    Accepted paths are canonical: '/'-separated non-empty components, none of them '.' or '..',
    no backslashes, NUL or control characters, valid UTF-8, bounded length.
    """
    if not isinstance(path, str) or path == "":
        raise UnsafePath("shard path is empty")
    if path.startswith("/"):
        raise UnsafePath(f"shard path {path!r} is absolute; paths are relative to the checkpoint")
    if "\\" in path:
        raise UnsafePath(f"shard path {path!r} contains a backslash; use '/' as separator")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise UnsafePath(f"shard path {path!r} contains NUL or control characters")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"shard path {path!r} is not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise UnsafePath(f"shard path is {len(encoded)} bytes long; the limit is {MAX_PATH_BYTES}")
    for part in path.split("/"):
        if part == "":
            raise UnsafePath(f"shard path {path!r} has an empty component ('//' or trailing '/')")
        if part in (".", ".."):
            raise UnsafePath(f"shard path {path!r} has a {part!r} component")
        if part.endswith(PARTIAL_SUFFIX):
            raise UnsafePath(
                f"shard path {path!r}: names ending in {PARTIAL_SUFFIX!r} are reserved"
            )
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise UnsafePath(
                f"shard path {path!r} has a component over {MAX_COMPONENT_BYTES} bytes"
            )
    return path


def validate_name(name: str) -> str:
    """Job names: URL-safe, [A-Za-z0-9][A-Za-z0-9._-]{0,127}."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UnsafePath(
            f"name {name!r} is not URL-safe: it must match [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}"
        )
    return name


def validate_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UnsafePath(f"step {step!r} must be an integer >= 0")
    return step


def checkpoint_parts(job: str, step: int, rel: str | None = None) -> list[str]:
    parts = [validate_name(job), str(validate_step(step))]
    if rel is not None:
        parts.extend(validate_relative_path(rel).split("/"))
    return parts


def partial_name(name: str) -> str:
    """The temp name a copy of shard `name` writes before it renames (deterministic, so a retry
    finds it; hashed when the name is too long to carry the prefix and suffix)."""
    candidate = f".{name}{PARTIAL_SUFFIX}"
    if len(candidate.encode("utf-8")) <= MAX_COMPONENT_BYTES:
        return candidate
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f".{digest}{PARTIAL_SUFFIX}"


def is_partial_name(name: str) -> bool:
    """Whether `name` has the shape of our own temp files (`partial_name`): the only files besides
    registered shards that tierpoint ever deletes on a POSIX tier."""
    return (
        name.startswith(".")
        and name.endswith(PARTIAL_SUFFIX)
        and len(name) > 1 + len(PARTIAL_SUFFIX)
    )
