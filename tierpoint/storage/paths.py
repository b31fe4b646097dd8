"""Path confinement for tier roots (invariant 6: nothing outside a tier root is ever touched).

Shard paths come from manifests, i.e. from users. They are validated lexically first
(`validate_relative_path`), then resolved against the real path of the tier root so that symlinks
cannot lead outside it (`resolve_shard_path`, `ensure_checkpoint_parent`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tierpoint_client import paths as rule
from tierpoint_client.errors import UnsafePathError

from tierpoint.config import NAME_RE, TierConfig, TierKind
from tierpoint.errors import UnsafePath

# The rule itself lives in the training-side client (a dependency of the service): one statement
# of it, so that a path the client's manifest builder accepts is one the API accepts, and back.
MAX_PATH_BYTES = rule.MAX_PATH_BYTES
MAX_COMPONENT_BYTES = rule.MAX_PART_BYTES
# Temp files of copies in progress end with this; shard names may not, so they never collide.
PARTIAL_SUFFIX = rule.PARTIAL_SUFFIX


def validate_relative_path(path: str) -> str:
    """Return `path` unchanged if it is a safe relative shard path, else raise UnsafePath (the
    client's rule, `tierpoint_client.paths.validate_relative_path`, with the server's error)."""
    try:
        return rule.validate_relative_path(path)
    except UnsafePathError as exc:
        raise UnsafePath(str(exc)) from None


# Two paths of one manifest that cannot both be files (`a` and `a/b`).
path_conflict = rule.path_conflict
path_conflict_message = rule.path_conflict_message


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


def object_key(prefix: str, job: str, step: int, rel: str) -> str:
    """The S3 key of a shard: the tier's prefix, then `<job>/<step>/<path>`, every character as it
    is (S3 keys are UTF-8 bytes; nothing is encoded here, and nothing may decode it later)."""
    return prefix + "/".join(checkpoint_parts(job, step, rel))


def s3_object(
    tier: TierConfig | None, job: str, step: int, rel: str
) -> tuple[str, str] | tuple[None, None]:
    """(bucket, key) of a shard's copy on `tier` if it is a configured S3 tier, else (None, None):
    what the API hands readers, so that none of them has to take a location string apart."""
    if tier is None or tier.kind is not TierKind.S3 or not tier.bucket:
        return None, None
    return tier.bucket, object_key(tier.prefix, job, step, rel)


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
