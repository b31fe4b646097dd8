"""Path confinement for tier roots (invariant 6: nothing outside a tier root is ever touched).

Shard paths come from manifests, i.e. from users. They are validated lexically here
(`validate_relative_path`); a POSIX tier then reaches them without following any symlink below its
root (`tierpoint.storage.posix.confined`), so a shard stays inside its own `<job>/<step>/`.
"""

from __future__ import annotations

import hashlib

from tierpoint_client import paths as rule
from tierpoint_client.errors import UnsafePathError

from tierpoint.errors import UnsafePath

# The rule itself lives in the training-side client (a dependency of the service): one statement
# of it, so that a path the client's manifest builder accepts is one the API accepts, and back.
MAX_PATH_BYTES = rule.MAX_PATH_BYTES
MAX_COMPONENT_BYTES = rule.MAX_PART_BYTES
# Temp files of copies in progress end with this; shard names may not, so they never collide.
PARTIAL_SUFFIX = rule.PARTIAL_SUFFIX
# A shard's file a delete renamed aside to check it (`tierpoint/storage/posix/removal.py`).
ASIDE_SUFFIX = rule.ASIDE_SUFFIX


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


# Steps are bounded by what every JSON reader holds exactly: JavaScript's numbers (the dashboard)
# are doubles, so 2^53 and 2^53 + 1 would be one step there. No step above it is registered.
MAX_STEP = 2**53 - 1


def validate_name(name: str, what: str = "name") -> str:
    """Job (and tier) names: the client's rule (`tierpoint_client.paths.NAME_RULE`); the
    refusal says it in words, naming what the name is for ("job name")."""
    if not rule.is_valid_name(name):
        raise UnsafePath(rule.name_error(what, name))
    return name


def validate_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UnsafePath(f"step {step!r} must be an integer >= 0")
    return step


def step_dir(step: int, branch: int = 1) -> str:
    """A checkpoint's directory under its job's on every tier (and in S3 keys): the step on a
    job's first branch, as before branches; `<step>.b<branch>` on later ones, so a step saved
    again after a rollback never shares a file with the one it supersedes."""
    validate_step(step)
    if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
        raise UnsafePath(f"branch {branch!r} must be an integer >= 1")
    return str(step) if branch == 1 else f"{step}.b{branch}"


def parse_step_dir(name: str) -> tuple[int, int]:
    """(step, branch) of a checkpoint directory's name; ValueError for anything else."""
    step, dot, branch = name.partition(".b")
    if not (step.isascii() and step.isdigit()) or int(step) > MAX_STEP:
        raise ValueError(f"the step is a number from 0 to {MAX_STEP}")
    if not dot:
        return int(step), 1
    if not (branch.isascii() and branch.isdigit()) or branch.startswith("0") or int(branch) < 2:
        raise ValueError("a branch directory is <step>.b<branch>, the branch 2 or more")
    return int(step), int(branch)


def checkpoint_parts(job: str, step: int, rel: str | None = None, branch: int = 1) -> list[str]:
    parts = [validate_name(job), step_dir(step, branch)]
    if rel is not None:
        parts.extend(validate_relative_path(rel).split("/"))
    return parts


# The temp name a copy of shard `name` writes before it renames: deterministic (no tag), so a
# retry finds it; hashed when the name is too long to carry the prefix and suffix. The client's
# rule, so that its temp names and ours fit the same names.
partial_name = rule.partial_name


def aside_name(name: str) -> str:
    """The name a delete renames shard `name` to while it checks it is the recorded file
    (deterministic, so that a later attempt finds what an interrupted one left)."""
    candidate = f".{name}{ASIDE_SUFFIX}"
    if len(candidate.encode("utf-8")) <= MAX_COMPONENT_BYTES:
        return candidate
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f".{digest}{ASIDE_SUFFIX}"


def is_partial_name(name: str) -> bool:
    """Whether `name` has the shape of our own temp files (`partial_name`): the only files besides
    registered shards that tierpoint ever deletes on a POSIX tier."""
    return (
        name.startswith(".")
        and name.endswith(PARTIAL_SUFFIX)
        and len(name) > 1 + len(PARTIAL_SUFFIX)
    )
