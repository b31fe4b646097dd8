"""What every tier backend offers. Activities speak only this interface.

A checkpoint's directory on a tier is `<root>/<job>/<step>/` (or `<prefix><job>/<step>/` in a
bucket); shard paths are relative to it and confined to it: on a POSIX tier no component below
the root is ever followed if it is a symlink (an operation on such a shard raises UnsafePath).

We delete only what we registered: a store removes the shards it is named and its own temp files
(POSIX `.<name>.tierpoint-partial`, S3 multipart uploads of those keys), never anything else in
a checkpoint's directory or under its prefix, and a directory only once it is empty. And only the
bytes the catalog verified: a POSIX store removes a shard's file only while it is still the file
the catalog recorded (`RecordedCopy.identity`, `tierpoint/storage/posix/identity.py`); a file
put at the shard's path since (the job writing the step again) is kept and reported.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from tierpoint.tier_config import TierConfig


@dataclass(frozen=True)
class ShardRef:
    job: str
    step: int
    path: str  # relative to the checkpoint directory; validated by tierpoint.storage.paths
    # The job's branch it was saved on: its directory is `paths.step_dir(step, branch)`.
    branch: int = 1


@dataclass
class ResumeState:
    """What a retried copy needs to go on where the last attempt stopped (heartbeat details).

    Primitive fields only: it travels as Temporal heartbeat details.
    """

    offset: int = 0
    crc: int = 0  # crc32c of bytes [0, offset)
    upload_id: str | None = None  # S3 multipart upload in progress
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CopyResult:
    size: int
    crc32c: str  # 8 lowercase hex digits of what was read from the source and written
    # Which file the write committed (POSIX: `FileIdentity` token; None on S3): what a copy that
    # must take its write back again hands to `delete`, so it never removes another's file.
    identity: str | None = None


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    size: int | None
    crc32c: str | None
    reason: str | None = None  # why not ok: "missing", "size 10 != 12", "crc32c 0badf00d != ..."
    # Which file was read (POSIX: `FileIdentity` token, whatever the outcome; None on S3 or when
    # nothing was there): recorded on the replica, so that a delete removes only this file.
    identity: str | None = None


@dataclass(frozen=True)
class RecordedCopy:
    """A shard's copy on a tier as the catalog knows it, which is what a delete may remove: the
    path, the registered size and crc32c, and the identity of the file the catalog verified there
    (None when none was recorded: a replica from before identities were recorded, or one never
    read back; a POSIX store then removes the file only if its bytes are the registered ones)."""

    path: str
    size: int = 0
    crc32c: str | None = None
    identity: str | None = None


LEFT_EXAMPLES = 10


@dataclass(frozen=True)
class DeleteReport:
    """What deleting a checkpoint's registered shards did, and what it left alone."""

    deleted: int = 0  # registered shards that were there and are gone now
    # Up to LEFT_EXAMPLES entries still in the checkpoint's directory (or under its prefix),
    # relative to it: nobody registered them, so they are reported and never deleted.
    left: tuple[str, ...] = ()
    # Registered shards whose path holds another file than the one the catalog verified (it was
    # replaced since, e.g. the job wrote the step again): kept, never deleted.
    kept: tuple[str, ...] = ()


class StorageError(Exception):
    """A tier operation that failed for a reason retrying with the same input will not fix."""


class SourceSizeMismatch(StorageError):
    """The source holds fewer or more bytes than the size the copy was asked to write."""


class ChecksumMismatch(StorageError):
    """The destination's own checksum of what it stored differs from what was sent."""


ByteSource = BinaryIO | io.RawIOBase
"""What a copy reads from: a binary file object, or a raw reader (what open_read returns)."""

ProgressFn = Callable[[ResumeState], None]
"""Called as a copy makes progress (at chunk granularity); the caller rate-limits what it does."""


class ShardSource(Protocol):
    """What a copy reads its shards from: a tier store, or another node's data endpoint."""

    def open_read(self, ref: ShardRef, offset: int = 0) -> BinaryIO:
        """A raw reader positioned at offset; FileNotFoundError when the shard is not there."""
        ...


class TierStore(Protocol):
    config: TierConfig

    def location(self, ref: ShardRef) -> str:
        """Where the shard lives, for people to read: an absolute path, or s3://bucket/key with the
        key's characters as they are (not a URL: `?`, `#` and `%` are part of the key). Code that
        reads an object takes the bucket and the key separately, never from this string."""
        ...

    def open_read(self, ref: ShardRef, offset: int = 0) -> BinaryIO:
        """A raw reader positioned at offset (throttled if the tier has a read bandwidth limit)."""
        ...

    def size(self, ref: ShardRef) -> int | None:
        """Size of the committed shard, None if there is none."""
        ...

    def write(
        self,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
        """Write size bytes from source (positioned at resume.offset) atomically.

        Computes crc32c in the same pass. Nothing is visible under the final name until every byte
        is durable (temp name + fsync + rename; S3: multipart complete with checksums).
        """
        ...

    def verify(self, ref: ShardRef, size: int, crc32c: str) -> VerifyResult:
        """Read the committed shard back from the device (not the page cache) or use the
        object store's stored checksum, and compare with the registered size and crc32c."""
        ...

    def checksum(
        self, ref: ShardRef, progress: Callable[[int], None] | None = None
    ) -> VerifyResult:
        """Compute size and crc32c of the committed shard reading from the device (seal stage)."""
        ...

    def delete(self, ref: ShardRef, written: str | None) -> None:
        """Take back what a copy wrote: the shard's temp file, and the shard if it is still the
        file `written` names (the copy's `CopyResult.identity`; None: this copy committed nothing,
        so a POSIX store removes only the temp file), then its directories while they are empty
        (never the tier root). An absent shard is not an error (idempotent)."""
        ...

    def delete_checkpoint(
        self, job: str, step: int, copies: Iterable[RecordedCopy], branch: int = 1
    ) -> DeleteReport:
        """Remove the checkpoint's registered shards `copies` (and their temp files / multipart
        uploads), then each directory that held them while it is empty, up to `<job>/`. The
        checkpoint is the one saved on `branch` (its directory `paths.step_dir(step, branch)`).

        A POSIX store removes a shard's file only if it is the one the catalog recorded (its
        identity, or where none was recorded its registered size and crc32c read now), atomically
        with respect to anything renamed onto the path meanwhile; another file there is kept and
        named in `kept`. Anything else in the checkpoint's directory or under its prefix is left
        where it is and named in the report. Idempotent. A shard reached only through a symlink
        raises UnsafePath: nothing is deleted through one.
        """
        ...

    def cleanup_partial(self, ref: ShardRef, resume: ResumeState | None) -> None:
        """Drop abandoned temp files / multipart uploads of this shard (only those: never the
        shard itself nor a neighbour)."""
        ...
