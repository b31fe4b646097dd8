"""S3 tiers (AWS S3, MinIO, Ceph RGW, moto): whole objects with CRC32C checksums S3 checks.

Objects up to one part are written with a single PutObject carrying x-amz-checksum-crc32c.
Larger ones use a multipart upload created with ChecksumAlgorithm=CRC32C and, where the endpoint
supports it, ChecksumType=FULL_OBJECT: every part carries its own CRC32C (S3 rejects a corrupted
part), the completion carries the whole-object CRC32C (S3 rejects a wrong assembly), and the
stored checksum is then directly the registered crc32c, so verification needs no read-back.
Nothing is visible under the key before the completion (invariant 4).

A retried write resumes the same upload: the heartbeat state carries the upload id, the offset
of the contiguous prefix of finished parts and the crc32c of that prefix; S3's ListParts is the
source of truth for which parts exist.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, cast

from botocore.exceptions import ClientError

from tierpoint.config import TierConfig, TierKind
from tierpoint.storage.base import (
    ByteSource,
    ChecksumMismatch,
    CopyResult,
    ProgressFn,
    ResumeState,
    ShardRef,
    SourceSizeMismatch,
    VerifyResult,
)
from tierpoint.storage.checksum import (
    crc32c_combine,
    crc32c_from_base64,
    crc32c_hex,
    crc32c_of,
    crc32c_of_stream,
    crc32c_to_base64,
    parse_crc32c,
)
from tierpoint.storage.paths import checkpoint_parts
from tierpoint.storage.posix import position_source, read_full
from tierpoint.storage.throttle import TokenBucket

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS = 10_000
READ_BUFFER_SIZE = 8 * 1024 * 1024
FULL_OBJECT: Literal["FULL_OBJECT"] = "FULL_OBJECT"


def error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _is_not_found(e: ClientError) -> bool:
    return error_code(e) in ("404", "NoSuchKey", "NotFound")


def part_size_for(config: TierConfig, size: int) -> int:
    """The tier's part size, raised to S3's minimum and to fit in 10,000 parts.

    Deterministic in (config, size), so a retried write cuts the same parts.
    """
    part = max(config.multipart_part_size, MIN_PART_SIZE)
    if size > part * MAX_PARTS:
        mib = 1024 * 1024
        part = math.ceil(size / MAX_PARTS / mib) * mib
    return part


class S3Reader(io.RawIOBase):
    """Streaming, seekable reader of one object (a ranged GetObject, reopened after a seek)."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        key: str,
        offset: int = 0,
        limiter: TokenBucket | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._key = key
        self._pos = offset
        self._limiter = limiter
        self._body: Any = None
        self._eof = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _open(self) -> None:
        if self._body is not None or self._eof:
            return
        kwargs: dict[str, Any] = {}
        if self._pos > 0:
            kwargs["Range"] = f"bytes={self._pos}-"
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=self._key, **kwargs)
        except ClientError as e:
            if error_code(e) == "InvalidRange":  # offset at or past the end
                self._eof = True
                return
            raise
        self._body = resp["Body"]

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        self._open()
        if self._eof:
            return 0
        n = int(self._body.readinto(buffer))
        if self._limiter is not None:
            self._limiter.consume(n)
        if n == 0:
            self._eof = True
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET:
            raise io.UnsupportedOperation("S3Reader seeks from the start only")
        if offset != self._pos:
            self._drop_body()
            self._pos = offset
            self._eof = False
        return self._pos

    def tell(self) -> int:
        return self._pos

    def _drop_body(self) -> None:
        if self._body is not None:
            with contextlib.suppress(Exception):
                self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


class _PartBody(io.RawIOBase):
    """A request body over a part buffer without copying it; seekable so botocore can retry."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        n = min(len(buffer), len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = len(self._data) + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class _Upload:
    upload_id: str
    full_object: bool
    offset: int
    crc: int
    # part number -> (etag, base64 crc32c or None)
    parts: dict[int, tuple[str, str | None]]


@dataclass
class _Prefix:
    """The contiguous run of finished parts from the start, and its crc32c."""

    offset: int
    crc: int
    part_size: int
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)

    def add(self, number: int, crc: int, length: int) -> bool:
        """Record a finished part; True if the prefix grew."""
        self.pending[number] = (crc, length)
        grew = False
        while (nxt := self.offset // self.part_size + 1) in self.pending:
            part_crc, part_len = self.pending.pop(nxt)
            self.crc = crc32c_combine(self.crc, part_crc, part_len)
            self.offset += part_len
            grew = True
        return grew


class S3Store:
    def __init__(
        self, config: TierConfig, client: S3Client, *, limiter: TokenBucket | None = None
    ) -> None:
        if config.kind is not TierKind.S3 or not config.bucket:
            raise ValueError(f"tier {config.name!r} is not an s3 tier")
        self.config = config
        self.client = client
        self.bucket: str = config.bucket
        self.prefix = config.prefix
        self.limiter = limiter

    # -- naming ---------------------------------------------------------------------------

    def key(self, ref: ShardRef) -> str:
        return self.prefix + "/".join(checkpoint_parts(ref.job, ref.step, ref.path))

    def checkpoint_prefix(self, job: str, step: int) -> str:
        return self.prefix + "/".join(checkpoint_parts(job, step)) + "/"

    def location(self, ref: ShardRef) -> str:
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
            if _is_not_found(e):
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
            if _is_not_found(e):
                return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
            raise
        return VerifyResult(ok=True, size=size, crc32c=crc32c_hex(crc))

    @staticmethod
    def stored_crc32c(head: dict[str, Any]) -> int | None:
        """The object's whole-content CRC32C as S3 stored it, None if S3 has no such value
        (no CRC32C, or a COMPOSITE checksum of part checksums)."""
        value = head.get("ChecksumCRC32C")
        if not value or "-" in value or head.get("ChecksumType") not in (None, FULL_OBJECT):
            return None
        try:
            return crc32c_from_base64(value)
        except ValueError:
            return None

    @staticmethod
    def whole_object_checksum(head: dict[str, Any]) -> bool:
        """Whether the stored CRC32C certainly covers the whole content: labelled FULL_OBJECT,
        or the object was a single PUT (its ETag has no '-<parts>' suffix)."""
        if head.get("ChecksumType") == FULL_OBJECT:
            return True
        return "-" not in str(head.get("ETag", "")).strip('"')

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
        stored = self.stored_crc32c(head)
        how = "stored by S3"
        if stored is None or (stored != expected and not self.whole_object_checksum(head)):
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
            return self._put_whole(ref, source, size, resume)
        return self._multipart(ref, source, size, part_size, resume, progress)

    def _check_source_end(self, ref: ShardRef, source: ByteSource, size: int) -> None:
        if read_full(source, memoryview(bytearray(1))):
            raise SourceSizeMismatch(f"source of {ref.path!r} holds more than {size} bytes")

    def _put_whole(
        self, ref: ShardRef, source: ByteSource, size: int, resume: ResumeState | None
    ) -> CopyResult:
        position_source(source, resume.offset if resume else 0, 0)
        buf = bytearray(size)
        n = read_full(source, memoryview(buf))
        if n < size:
            raise SourceSizeMismatch(f"source of {ref.path!r} ended at {n} bytes, expected {size}")
        self._check_source_end(ref, source, size)
        crc = crc32c_of(buf)
        self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(ref),
            Body=cast(Any, _PartBody(memoryview(buf))),
            ContentLength=size,
            ChecksumAlgorithm="CRC32C",
            ChecksumCRC32C=crc32c_to_base64(crc),
        )
        return CopyResult(size=size, crc32c=crc32c_hex(crc))

    def _list_parts(self, key: str, upload_id: str) -> dict[int, dict[str, Any]] | None:
        parts: dict[int, dict[str, Any]] = {}
        marker = 0
        while True:
            try:
                resp = self.client.list_parts(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker
                )
            except ClientError as e:
                if error_code(e) in ("NoSuchUpload", "404"):
                    return None
                raise
            for p in resp.get("Parts", []):
                parts[int(p["PartNumber"])] = cast(dict[str, Any], p)
            if not resp.get("IsTruncated"):
                return parts
            marker = int(resp["NextPartNumberMarker"])

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            if error_code(e) not in ("NoSuchUpload", "404"):
                raise

    def _resume_upload(
        self, key: str, resume: ResumeState | None, size: int, part_size: int
    ) -> _Upload | None:
        if resume is None or not resume.upload_id:
            return None
        usable = (
            resume.extra.get("part_size") == part_size
            and 0 <= resume.offset <= size
            and resume.offset % part_size == 0
        )
        parts = self._list_parts(key, resume.upload_id)
        if parts is None:
            return None
        done = resume.offset // part_size
        if usable and all(
            n in parts and int(parts[n]["Size"]) == part_size for n in range(1, done + 1)
        ):
            return _Upload(
                upload_id=resume.upload_id,
                full_object=resume.extra.get("checksum_type") == FULL_OBJECT,
                offset=resume.offset,
                crc=resume.crc,
                parts={
                    n: (str(parts[n]["ETag"]), parts[n].get("ChecksumCRC32C"))
                    for n in range(1, done + 1)
                },
            )
        # S3 does not hold what the state claims: start over on a new upload.
        self._abort(key, resume.upload_id)
        return None

    def _create_upload(self, key: str) -> _Upload:
        resp = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="CRC32C", ChecksumType=FULL_OBJECT
        )
        return _Upload(
            upload_id=resp["UploadId"],
            full_object=resp.get("ChecksumType") == FULL_OBJECT,
            offset=0,
            crc=0,
            parts={},
        )

    def _upload_part(self, key: str, upload_id: str, number: int, data: memoryview) -> str:
        resp = self.client.upload_part(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=cast(Any, _PartBody(data)),
            ContentLength=len(data),
            ChecksumAlgorithm="CRC32C",
            ChecksumCRC32C=crc32c_to_base64(crc32c_of(data)),
        )
        return resp["ETag"]

    def _multipart(
        self,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        part_size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
        key = self.key(ref)
        upload = self._resume_upload(key, resume, size, part_size) or self._create_upload(key)
        position_source(source, resume.offset if resume else 0, upload.offset)
        extra = {
            "part_size": part_size,
            "checksum_type": FULL_OBJECT if upload.full_object else "COMPOSITE",
        }

        def report(offset: int, crc: int) -> None:
            if progress is not None:
                progress(
                    ResumeState(offset=offset, crc=crc, upload_id=upload.upload_id, extra=extra)
                )

        # Report the upload id at once, so a retry finds (or cleans up) this upload.
        report(upload.offset, upload.crc)

        concurrency = self.config.multipart_concurrency
        # One buffer being filled while `concurrency` parts upload: memory stays bounded.
        buffers = [bytearray(part_size) for _ in range(concurrency + 1)]
        free = list(range(len(buffers)))
        inflight: dict[Future[str], tuple[int, int, int, int]] = {}
        prefix = _Prefix(offset=upload.offset, crc=upload.crc, part_size=part_size)
        offset = upload.offset

        def harvest(done: set[Future[str]], *, strict: bool) -> None:
            for fut in done:
                number, index, part_crc, length = inflight.pop(fut)
                free.append(index)
                if fut.cancelled() or fut.exception() is not None:
                    if strict:
                        fut.result()
                    continue
                upload.parts[number] = (fut.result(), crc32c_to_base64(part_crc))
                if prefix.add(number, part_crc, length):
                    report(prefix.offset, prefix.crc)

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="s3-part") as pool:
            try:
                while offset < size or inflight:
                    if offset < size and free:
                        index = free.pop()
                        length = min(part_size, size - offset)
                        view = memoryview(buffers[index])[:length]
                        n = read_full(source, view)
                        if n < length:
                            raise SourceSizeMismatch(
                                f"source of {ref.path!r} ended at {offset + n} bytes, "
                                f"expected {size}"
                            )
                        number = offset // part_size + 1
                        fut = pool.submit(self._upload_part, key, upload.upload_id, number, view)
                        inflight[fut] = (number, index, crc32c_of(view), length)
                        offset += length
                        continue
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    harvest(done, strict=True)
            except BaseException:
                # Parts already on their way may still land: record them, so that the retry
                # resumes after them instead of sending them again.
                for fut in inflight:
                    fut.cancel()
                done, _ = wait(inflight)
                harvest(done, strict=False)
                raise
        self._check_source_end(ref, source, size)
        self._complete(key, upload, size, prefix.crc)
        # Earlier attempts whose state was lost left uploads behind; the object is whole now,
        # so whatever else is pending for this key is garbage.
        self._abort_uploads(key, exact_key=key)
        return CopyResult(size=size, crc32c=crc32c_hex(prefix.crc))

    def _complete(self, key: str, upload: _Upload, size: int, crc: int) -> None:
        parts: list[dict[str, Any]] = []
        for number in sorted(upload.parts):
            etag, part_crc = upload.parts[number]
            entry: dict[str, Any] = {"PartNumber": number, "ETag": etag}
            if part_crc:
                entry["ChecksumCRC32C"] = part_crc
            parts.append(entry)
        kwargs: dict[str, Any] = {}
        if upload.full_object:
            # S3 refuses to complete if the assembled object does not have this CRC32C.
            kwargs = {"ChecksumCRC32C": crc32c_to_base64(crc), "ChecksumType": FULL_OBJECT}
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": cast(Any, parts)},
                **kwargs,
            )
        except ClientError as e:
            if error_code(e) in ("BadDigest", "InvalidPart", "InvalidPartOrder"):
                # These parts can never complete: drop them so the retry starts clean.
                self._abort(key, upload.upload_id)
                raise ChecksumMismatch(f"S3 refused to complete {key}: {e}") from e
            raise
        if upload.full_object:
            # Servers that accept but do not check the whole-object checksum are caught here.
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            stored = self.stored_crc32c(cast(dict[str, Any], head))
            if int(head["ContentLength"]) != size or (stored is not None and stored != crc):
                self.client.delete_object(Bucket=self.bucket, Key=key)
                raise ChecksumMismatch(
                    f"S3 stored {key} with size {head['ContentLength']} and crc32c "
                    f"{crc32c_hex(stored) if stored is not None else None}, "
                    f"sent {size} bytes with crc32c {crc32c_hex(crc)}"
                )

    # -- removing -------------------------------------------------------------------------

    def delete(self, ref: ShardRef) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(ref))

    def _abort_uploads(self, prefix: str, exact_key: str | None = None) -> None:
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for u in page.get("Uploads", []):
                if exact_key is None or u["Key"] == exact_key:
                    self._abort(u["Key"], u["UploadId"])

    def delete_checkpoint(self, job: str, step: int) -> None:
        prefix = self.checkpoint_prefix(job, step)
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if not keys:
                continue
            resp = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": cast(Any, keys), "Quiet": True}
            )
            errors = resp.get("Errors", [])
            if errors:
                first = errors[0]
                raise OSError(
                    f"S3 refused to delete {len(errors)} objects under {prefix}, e.g. "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
        self._abort_uploads(prefix)

    def cleanup_partial(self, ref: ShardRef, resume: ResumeState | None) -> None:
        key = self.key(ref)
        if resume is not None and resume.upload_id:
            self._abort(key, resume.upload_id)
        self._abort_uploads(key, exact_key=key)
