"""Errors raised by the client. API errors carry the RFC 9457 problem's stable `code`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TierpointError(Exception):
    """Base class of every error this package raises."""


class TransportError(TierpointError):
    """The API could not be reached (after retries): connection refused, reset, timed out."""


class ApiError(TierpointError):
    """The API answered with an error status; `code` is the problem's machine-readable code."""

    def __init__(
        self,
        status: int,
        code: str | None,
        detail: str | None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.problem: dict[str, Any] = problem or {}
        super().__init__(
            f"HTTP {status} {code or 'error'}: {detail or self.problem.get('title', '')}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable with its fields (Exception pickles only the message), so that an error can
        # cross processes, e.g. a DCP rank's gathered to the coordinator.
        return (type(self), (self.status, self.code, self.detail, self.problem))

    @property
    def errors(self) -> list[Any]:
        """Per-field validation errors, when the API gives them."""
        errs = self.problem.get("errors")
        return errs if isinstance(errs, list) else []


class InvalidRequestError(ApiError):
    """400/413/422: the request was refused and nothing was changed (e.g. unsafe_path)."""


class AuthError(ApiError):
    """401/403: missing or insufficient bearer token."""


class NotFoundError(ApiError):
    """404: no such job, checkpoint or tier."""


class ConflictError(ApiError):
    """409: a different manifest is already registered for this (job, step)."""


class ServerError(ApiError):
    """5xx (or 429 Too Many Requests) that persisted through every retry."""


def error_for(
    status: int, code: str | None, detail: str | None, problem: dict[str, Any] | None
) -> ApiError:
    cls: type[ApiError]
    if status == 409:
        cls = ConflictError
    elif status == 404:
        cls = NotFoundError
    elif status in (401, 403):
        cls = AuthError
    elif status >= 500 or status == 429:
        cls = ServerError
    elif 400 <= status < 500:
        cls = InvalidRequestError
    else:
        cls = ApiError
    return cls(status, code, detail, problem)


class CheckpointFailedError(TierpointError):
    """The checkpoint can no longer become restorable on the awaited tier."""

    def __init__(self, job: str, step: int, tier: str, state: str, reason: str | None) -> None:
        self.job, self.step, self.tier, self.state, self.reason = job, step, tier, state, reason
        super().__init__(f"{job}/{step} is {state} on tier {tier}: {reason or 'no reason given'}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job, self.step, self.tier, self.state, self.reason)


class InvalidJobNameError(TierpointError, ValueError):
    """A job name the API would refuse (422 `invalid_job_name`): refused before anything is
    written under it."""


class UnsafePathError(TierpointError, ValueError):
    """A shard path would land outside its checkpoint directory (or is otherwise malformed)."""


class ManifestError(TierpointError, ValueError):
    """The checkpoint directory or file list cannot be turned into a manifest."""


class ChecksumMismatchError(TierpointError):
    """Bytes read from a restore source do not match the registered size or crc32c.

    Nothing is left under the final name when this is raised.
    """

    def __init__(
        self,
        path: str,
        source: str,
        expected_size: int,
        actual_size: int,
        expected_crc32c: str | None,
        actual_crc32c: str,
    ) -> None:
        self.path = path
        self.source = source
        self.expected_size = expected_size
        self.actual_size = actual_size
        self.expected_crc32c = expected_crc32c
        self.actual_crc32c = actual_crc32c
        super().__init__(
            f"{path}: bytes from {source} do not match the registered checkpoint "
            f"(size {actual_size} vs {expected_size}, crc32c {actual_crc32c} vs {expected_crc32c})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.expected_size, self.actual_size, self.expected_crc32c, self.actual_crc32c)
        return type(self), (self.path, self.source, *args)


class SaveMismatchError(TierpointError, ValueError):
    """The ranks of one DCP save named different jobs or steps: refused before any rank wrote."""


class MissingDependencyError(TierpointError, ImportError):
    """An optional dependency (boto3 for S3 restores) is not installed."""


class SourceError(TierpointError):
    """A copy cannot be read: a missing file, a refused or cut connection, an HTTP or S3 error,
    an unknown tier or kind. A restore goes on from the shard's next verified copy."""


class NoVerifiedCopyError(TierpointError):
    """No copy of a file could be read and verified: `tried` says, copy by copy, why (a read
    error, or bytes that did not match, which was reported to the server)."""

    def __init__(self, job: str | None, step: int | None, path: str, tried: Sequence[str]) -> None:
        self.job, self.step, self.path, self.tried = job, step, path, tuple(tried)
        detail = "; ".join(tried) if tried else "no verified copy is listed on any usable tier"
        where = f"{job}/{step}: " if job is not None else ""
        super().__init__(f"{where}no verified copy of {path!r} ({detail})")

    def __reduce__(self) -> tuple[Any, ...]:
        # DCP pickles a rank's exception to raise it on the others.
        return type(self), (self.job, self.step, self.path, self.tried)


class DestinationError(TierpointError):
    """The restore's destination cannot take the checkpoint as it is (not a directory, an entry
    where the checkpoint needs another kind, a symlink); nothing was written."""


class DestinationNotEmptyError(DestinationError):
    """The destination holds files and the restore was not told what to do with them
    (`existing="overwrite"` or `"clean"`); nothing was written. `entries` are some of them."""

    def __init__(self, dest: str, entries: Sequence[str], count: int) -> None:
        self.dest, self.entries, self.count = dest, tuple(entries), count
        shown = ", ".join(self.entries) + (
            f" and {count - len(entries)} more" if count > len(entries) else ""
        )
        super().__init__(f"{dest} is not empty ({shown})")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.dest, self.entries, self.count)


class RestoreInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a restore; the message says what the destination holds. A
    KeyboardInterrupt, so that whatever stops on one stops on this."""


class MissingCredentialsError(SourceError):
    """An S3 tier names environment variables for its keys (`credentials_env`) that this
    process does not have."""


class InvalidUrlError(TierpointError, ValueError):
    """A `tierpoint://` path that names no job, step folder or file tierpoint could keep; raised
    before anything is written."""


class ConfigurationError(TierpointError, ValueError):
    """The process lacks a setting it needs (the API's URL, a token, this node's id); raised
    before anything is written."""
