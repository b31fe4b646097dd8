"""S3 tiers (AWS S3, MinIO, Ceph RGW, moto): whole objects with CRC32C checksums S3 checks.

Objects up to one part are written with a single PutObject carrying x-amz-checksum-crc32c.
Larger ones use a multipart upload (`tierpoint.storage.s3.multipart`), which makes S3 check
every part and the whole-object CRC32C. Nothing is visible under the key before the PutObject
or the completion (invariant 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from botocore.exceptions import ClientError

from tierpoint.storage.base import (
    LEFT_EXAMPLES,
    ByteSource,
    CopyResult,
    DeleteReport,
    ProgressFn,
    RecordedCopy,
    ResumeState,
    ShardRef,
    SourceSizeMismatch,
    VerifyResult,
)
from tierpoint.storage.checksum import (
    crc32c_hex,
    crc32c_of,
    crc32c_of_stream,
    crc32c_to_base64,
    parse_crc32c,
)
from tierpoint.storage.s3.layout import KeyLayout
from tierpoint.storage.s3.multipart import MultipartUploads, part_size_for, request_body
from tierpoint.storage.s3.object_options import object_write_args
from tierpoint.storage.s3.reader import S3Reader
from tierpoint.storage.s3.responses import is_not_found, stored_crc32c, whole_object_checksum
from tierpoint.storage.source import check_source_end, position_source, read_full
from tierpoint.storage.throttle import TokenBucket
from tierpoint.tier_config import TierConfig, TierKind

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

READ_BUFFER_SIZE = 8 * 1024 * 1024
# Keys per DeleteObjects request (the API's limit).
DELETE_BATCH = 1000


class S3Store:
    def __init__(
        self,
        config: TierConfig,
        client: S3Client,
        *,
        limiter: TokenBucket | None = None,
        layout: KeyLayout | None = None,
    ) -> None:
        if config.kind is not TierKind.S3 or not config.bucket:
            raise ValueError(f"tier {config.name!r} is not an s3 tier")
        self.config = config
        # None until a checkpoint's recorded layout is given (`with_layout`): a key computed from
        # the tier's current setting could name another checkpoint's object, or none.
        self.layout = layout
        self.client = client
        self.bucket: str = config.bucket
        self.prefix = config.prefix
        self.limiter = limiter
        self.uploads = MultipartUploads(config, client, self.bucket)

    # -- naming ---------------------------------------------------------------------------

    def with_layout(self, layout: KeyLayout) -> S3Store:
        """This tier's store naming objects as `layout` does (the one recorded for the checkpoint
        it is used for); it shares the client and the limiter."""
        return S3Store(self.config, self.client, limiter=self.limiter, layout=layout)

    def _layout(self) -> KeyLayout:
        if self.layout is None:
            raise RuntimeError(
                f"tier {self.config.name}: an S3 key needs the checkpoint's recorded key layout"
            )
        return self.layout

    def key(self, ref: ShardRef) -> str:
        return self._layout().key(self.prefix, ref.job, ref.step, ref.path, ref.branch)

    def checkpoint_prefix(
        self, job: str, step: int, paths: Iterable[str] = (), branch: int = 1
    ) -> str:
        """The one prefix under which the checkpoint's shards `paths` live (the first of them
        for a spread layout, see `checkpoint_prefixes`)."""
        return self.checkpoint_prefixes(job, step, paths, branch)[0]

    def checkpoint_prefixes(
        self, job: str, step: int, paths: Iterable[str], branch: int = 1
    ) -> list[str]:
        return self._layout().checkpoint_prefixes(self.prefix, job, step, paths, branch)

    def location(self, ref: ShardRef) -> str:
        # For people to read (catalog rows, events, errors); readers are given (bucket, key).
        return f"s3://{self.bucket}/{self.key(ref)}"

    # -- reading --------------------------------------------------------------------------

    def open_read(self, ref: ShardRef, offset: int = 0) -> BinaryIO:
        reader = S3Reader(self.client, self.bucket, self.key(ref), offset, self.limiter)
        return cast(BinaryIO, reader)

    def _head(self, ref: ShardRef) -> dict[str, Any] | None:
        try:
            resp = self.client.head_object(
                Bucket=self.bucket, Key=self.key(ref), ChecksumMode="ENABLED"
            )
        except ClientError as e:
            if is_not_found(e):
                return None
            raise
        return cast(dict[str, Any], resp)

    def size(self, ref: ShardRef) -> int | None:
        head = self._head(ref)
        return None if head is None else int(head["ContentLength"])

    def _read_crc(self, ref: ShardRef, progress: Callable[[int], None] | None) -> tuple[int, int]:
        with S3Reader(self.client, self.bucket, self.key(ref), 0, self.limiter) as reader:
            return crc32c_of_stream(reader, READ_BUFFER_SIZE, progress)

    def checksum(
        self, ref: ShardRef, progress: Callable[[int], None] | None = None
    ) -> VerifyResult:
        try:
            size, crc = self._read_crc(ref, progress)
        except ClientError as e:
            if is_not_found(e):
                return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
            raise
        return VerifyResult(ok=True, size=size, crc32c=crc32c_hex(crc))

    def verify(self, ref: ShardRef, size: int, crc32c: str) -> VerifyResult:
        expected = parse_crc32c(crc32c)
        head = self._head(ref)
        if head is None:
            return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
        actual_size = int(head["ContentLength"])
        if actual_size != size:
            return VerifyResult(
                ok=False, size=actual_size, crc32c=None, reason=f"size {actual_size} != {size}"
            )
        stored = stored_crc32c(head)
        how = "stored by S3"
        if stored is None or (stored != expected and not whole_object_checksum(head)):
            # No stored checksum we can compare (none, or maybe a checksum of part checksums
            # from a server that does not label it): read the object back.
            actual_size, stored = self._read_crc(ref, None)
            how = "read back"
            if actual_size != size:
                return VerifyResult(
                    ok=False,
                    size=actual_size,
                    crc32c=crc32c_hex(stored),
                    reason=f"size {actual_size} != {size}",
                )
        # guard: s3-verify-crc
        got = crc32c_hex(stored)
        if stored != expected:
            return VerifyResult(
                ok=False,
                size=actual_size,
                crc32c=got,
                reason=f"crc32c {got} != {crc32c.lower()} ({how})",
            )
        return VerifyResult(ok=True, size=actual_size, crc32c=got)

    # -- writing --------------------------------------------------------------------------

    def write(
        self,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
        if size < 0:
            raise ValueError("size must be >= 0")
        part_size = part_size_for(self.config, size)
        if size <= part_size:
            return self._put_whole(ref, source, size, resume, progress)
        return self.uploads.upload(ref, self.key(ref), source, size, part_size, resume, progress)

    def _put_whole(
        self,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
        position_source(source, resume.offset if resume else 0, 0)
        buf = bytearray(size)
        # Nothing to resume from inside one PutObject: a heartbeat at offset 0 while reading.
        tick = None if progress is None else lambda: progress(ResumeState(offset=0, crc=0))
        n = read_full(source, memoryview(buf), tick)
        if n < size:
            raise SourceSizeMismatch(f"source of {ref.path!r} ended at {n} bytes, expected {size}")
        check_source_end(ref, source, size)
        crc = crc32c_of(buf)
        self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(ref),
            Body=cast(Any, request_body(memoryview(buf))),
            ContentLength=size,
            ChecksumAlgorithm="CRC32C",
            ChecksumCRC32C=crc32c_to_base64(crc),
            **object_write_args(self.config),
        )
        return CopyResult(size=size, crc32c=crc32c_hex(crc))

    # -- removing -------------------------------------------------------------------------

    def delete(self, ref: ShardRef, written: str | None) -> None:
        # An object has no identity of ours to check (`written` is None for S3 copies): a copy
        # takes back the key it writes, of the checkpoint whose copy it is.
        self.client.delete_object(Bucket=self.bucket, Key=self.key(ref))

    def delete_checkpoint(
        self, job: str, step: int, copies: Iterable[RecordedCopy], branch: int = 1
    ) -> DeleteReport:
        # The registered keys, never a listing of the prefix: an object someone else put there
        # (or a job wrote beside its shards) is not ours to delete. That no key here is a newer
        # checkpoint's object (the step registered again) is the caller's ordering: the catalog
        # lets a step be registered again, and so written again, only after its old copies'
        # deletes are done (`activities/retention.py: delete_copy`).
        paths = [c.path for c in copies]
        # guard: s3-deletes-only-registered
        keys = [self.key(ShardRef(job, step, p, branch)) for p in paths]
        prefixes = self.checkpoint_prefixes(job, step, paths, branch)
        deleted = 0
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            resp = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            errors = resp.get("Errors", [])
            if errors:
                first = errors[0]
                raise OSError(
                    f"S3 refused to delete {len(errors)} objects of {job}/{step}, e.g. "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
            deleted += len(batch)
        left: list[str] = []
        for prefix in prefixes:
            self.uploads.abort_uploads(prefix, set(keys))
            if len(left) < LEFT_EXAMPLES:
                listed = self.client.list_objects_v2(
                    Bucket=self.bucket, Prefix=prefix, MaxKeys=LEFT_EXAMPLES - len(left)
                )
                left.extend(o["Key"][len(prefix) :] for o in listed.get("Contents", []))
        return DeleteReport(deleted=deleted, left=tuple(left))

    def cleanup_partial(self, ref: ShardRef, resume: ResumeState | None) -> None:
        key = self.key(ref)
        if resume is not None and resume.upload_id:
            self.uploads.abort(key, resume.upload_id)
        self.uploads.abort_uploads(key, {key})
