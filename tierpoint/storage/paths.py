"""Path confinement for tier roots (invariant 6: nothing outside a tier root is ever touched).

Shard paths come from manifests, i.e. from users. They are validated lexically here
(`validate_relative_path`); a POSIX tier then reaches them without following any symlink below its
root (`tierpoint.storage.posix.confined`), so a shard stays inside its own `<job>/<step>/`.
"""

from __future__ import annotations

from tierpoint_client import paths as rule
from tierpoint_client.errors import UnsafePathError

from tierpoint.config import NAME_RE
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


def checkpoint_parts(job: str, step: int, rel: str | None = None) -> list[str]:
    parts = [validate_name(job), str(validate_step(step))]
    if rel is not None:
        parts.extend(validate_relative_path(rel).split("/"))
    return parts


# The temp name a copy of shard `name` writes before it renames: deterministic (no tag), so a
# retry finds it; hashed when the name is too long to carry the prefix and suffix. The client's
# rule, so that its temp names and ours fit the same names.
partial_name = rule.partial_name


def is_partial_name(name: str) -> bool:
    """Whether `name` has the shape of our own temp files (`partial_name`): the only files besides
    registered shards that tierpoint ever deletes on a POSIX tier."""
    return (
        name.startswith(".")
        and name.endswith(PARTIAL_SUFFIX)
        and len(name) > 1 + len(PARTIAL_SUFFIX)
    )
