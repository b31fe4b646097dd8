"""Path confinement for tier roots (invariant 6: nothing outside a tier root is ever touched).

Shard paths come from manifests, i.e. from users. They are validated lexically first
(`validate_relative_path`), then resolved against the real path of the tier root so that symlinks
cannot lead outside it (`resolve_shard_path`, `ensure_checkpoint_parent`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

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


def _inside(real_root: str, real_path: str) -> bool:
    return real_path == real_root or real_path.startswith(real_root.rstrip("/") + "/")


def _real_root(root: Path) -> str:
    return os.path.realpath(root)


def checkpoint_parts(job: str, step: int, rel: str | None = None) -> list[str]:
    parts = [validate_name(job), str(validate_step(step))]
    if rel is not None:
        parts.extend(validate_relative_path(rel).split("/"))
    return parts


def resolve_checkpoint_dir(root: Path, job: str, step: int) -> Path:
    """The real path of `<root>/<job>/<step>`, refused if a symlink leads it out of the root."""
    real_root = _real_root(root)
    target = os.path.realpath(os.path.join(real_root, *checkpoint_parts(job, step)))
    if not _inside(real_root, target) or target == real_root:
        raise UnsafePath(f"checkpoint directory {job}/{step} resolves outside the tier root")
    return Path(target)


def shard_entry(root: Path, job: str, step: int, rel: str) -> Path:
    """`<root>/<job>/<step>/<rel>` with the directories resolved (they must stay inside the real
    root) and the final component not followed: the name to create, rename onto, or unlink."""
    real_root = _real_root(root)
    parts = checkpoint_parts(job, step, rel)
    parent = os.path.realpath(os.path.join(real_root, *parts[:-1]))
    if not _inside(real_root, parent) or parent == real_root:
        raise UnsafePath(f"shard path {rel!r} resolves outside the tier root")
    return Path(parent, parts[-1])


def resolve_shard_path(root: Path, job: str, step: int, rel: str) -> Path:
    """The path of an existing or future shard at `<root>/<job>/<step>/<rel>`, symlinks resolved.

    The real path of the parent must stay inside the real path of the root. An existing final
    component that is a symlink is followed and must also stay inside; the result is the real
    path, so callers can open it with O_NOFOLLOW to catch a symlink swapped in afterwards.
    """
    candidate = shard_entry(root, job, step, rel)
    if os.path.islink(candidate):
        real_root = _real_root(root)
        real = os.path.realpath(candidate)
        if not _inside(real_root, real) or real == real_root:
            raise UnsafePath(f"shard path {rel!r} is a symlink that leads outside the tier root")
        return Path(real)
    return candidate


def ensure_parent_dirs(root: Path, job: str, step: int, rel: str) -> Path:
    """Create the directories above a shard one level at a time, never through a symlink that
    leaves the root, fsyncing the parent of each new one; return the shard's path (as
    `resolve_shard_path`)."""
    real_root = _real_root(root)
    os.makedirs(real_root, exist_ok=True)
    parts = checkpoint_parts(job, step, rel)
    current = real_root
    for part in parts[:-1]:
        nxt = os.path.join(current, part)
        try:
            os.mkdir(nxt, 0o755)
        except FileExistsError:
            pass
        else:
            # A new directory is durable only once its parent's entry is: a shard that is
            # fsynced and renamed must not vanish with its directory after a crash.
            _fsync_dir(current)
        real = os.path.realpath(nxt)
        if not _inside(real_root, real):
            raise UnsafePath(f"shard path {rel!r} resolves outside the tier root")
        if not os.path.isdir(real):
            raise UnsafePath(f"shard path {rel!r}: {part!r} exists and is not a directory")
        current = real
    return resolve_shard_path(root, job, step, rel)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open with O_NOFOLLOW | O_CLOEXEC; a symlink at the final component is an UnsafePath."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path.name!r} is a symlink; refusing to follow it") from None
        raise
