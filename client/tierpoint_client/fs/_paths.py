"""What a `tierpoint://` path names: a job, one of its step folders, or a file of a step.

Both forms a trainer hands over are the same path: DCP passes full URLs
(`tierpoint://llama/step-2/.metadata`), torchtitan and Lightning the protocol-stripped form that
fsspec's `url_to_fs` returns (`llama/step-2/.metadata`). A step folder is `step-<N>`, the name
torchtitan gives it and looks for when it resumes; N is the checkpoint's step in tierpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tierpoint_client.errors import InvalidUrlError
from tierpoint_client.paths import is_valid_name, name_error, validate_relative_path

PROTOCOL = "tierpoint"
PREFIX = f"{PROTOCOL}://"
_STEP = re.compile(r"^step-(0|[1-9][0-9]{0,17})$")


def strip(path: str) -> str:
    """The protocol-stripped form; idempotent, so either form may arrive."""
    if path.startswith(PREFIX):
        path = path[len(PREFIX) :]
    return path.strip("/")


def step_folder(step: int) -> str:
    return f"step-{step}"


@dataclass(frozen=True)
class FsPath:
    """A parsed path: `job` alone (""=the root), with `step`, with `file` (relative to the step)."""

    job: str
    step: int | None = None
    file: str | None = None

    @property
    def name(self) -> str:
        parts = [self.job]
        if self.step is not None:
            parts.append(step_folder(self.step))
        if self.file is not None:
            parts.append(self.file)
        return "/".join(parts)

    def folder(self) -> FsPath:
        return FsPath(self.job, self.step)


def parse(path: str) -> FsPath:
    """Raises InvalidUrlError (a ValueError) naming what is wrong, before anything is done."""
    stripped = strip(path)
    if not stripped:
        return FsPath("")
    job, _, rest = stripped.partition("/")
    if not is_valid_name(job):
        raise InvalidUrlError(f"{PREFIX}{stripped}: {name_error('job name', job)}")
    if not rest:
        return FsPath(job)
    folder, _, file = rest.partition("/")
    m = _STEP.match(folder)
    if m is None:
        raise InvalidUrlError(
            f"{PREFIX}{stripped}: {folder!r} is not a step folder; tierpoint keeps a job's "
            f"checkpoints as {PREFIX}{job}/step-<N>/ (N: the step, a non-negative integer)"
        )
    if not file:
        return FsPath(job, int(m[1]))
    try:
        return FsPath(job, int(m[1]), validate_relative_path(file))
    except ValueError as e:
        raise InvalidUrlError(f"{PREFIX}{stripped}: {e}") from e
