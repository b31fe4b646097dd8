"""Multipart uploads of objects larger than one part.

The upload is created with ChecksumAlgorithm=CRC32C and, where the endpoint supports it,
ChecksumType=FULL_OBJECT: every part carries its own CRC32C (S3 rejects a corrupted part), the
completion carries the whole-object CRC32C (S3 rejects a wrong assembly), and the stored checksum
is then directly the registered crc32c, so verification needs no read-back. Nothing is visible
under the key before the completion (invariant 4).

A retried write resumes the same upload: the heartbeat state carries the upload id, the offset
of the contiguous prefix of finished parts and the crc32c of that prefix; S3's ListParts is the
source of truth for which parts exist, and a part it lists beyond the prefix (finished after the
last heartbeat got through) is not sent again if it holds the bytes read for it.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Container
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from tierpoint.storage.base import (
    ByteSource,
    ChecksumMismatch,
    CopyResult,
    ProgressFn,
    ResumeState,
    ShardRef,
    SourceSizeMismatch,
)
from tierpoint.storage.checksum import crc32c_combine, crc32c_hex, crc32c_of, crc32c_to_base64
from tierpoint.storage.s3.buffers import PartBuffers
from tierpoint.storage.s3.object_options import object_write_args
from tierpoint.storage.s3.responses import (
    FULL_OBJECT,
    error_code,
    is_upload_gone,
    stored_crc32c,
)
from tierpoint.storage.source import check_source_end, position_source, read_full
from tierpoint.tier_config import TierConfig

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS = 10_000


def part_size_for(config: TierConfig, size: int) -> int:
    """The tier's part size, raised to S3's minimum and to fit in 10,000 parts.

    Deterministic in (config, size), so a retried write cuts the same parts.
    """
    part = max(config.multipart_part_size, MIN_PART_SIZE)
    if size > part * MAX_PARTS:
        mib = 1024 * 1024
        part = math.ceil(size / MAX_PARTS / mib) * mib
    return part


def request_body(data: memoryview) -> bytearray | PartBody:
    """What botocore sends: the buffer itself when it is exactly the part, so that the socket
    gets it in one `sendall`; a file-like view (read in 16 KiB blocks) otherwise, because
    botocore accepts bytes and bytearrays but no memoryview."""
    base = data.obj
    if isinstance(base, bytearray) and len(base) == len(data):
        return base
    return PartBody(data)


class PartBody(io.RawIOBase):
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
    # Parts S3 lists beyond the resumed prefix (finished after the last heartbeat got through):
    # not sent again if they hold the bytes read for them.
    listed: dict[int, dict[str, Any]] = field(default_factory=dict)


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


def _already_sent(listed: dict[str, Any] | None, data: memoryview, crc: int) -> bool:
    """Whether S3 holds this part with exactly these bytes: by its stored CRC32C where the
    endpoint lists one, else by its ETag (the MD5 of the part's bytes, unless the bucket encrypts
    with KMS or customer keys: then it differs and the part is simply sent again)."""
    if listed is None or int(listed["Size"]) != len(data):
        return False
    stored = listed.get("ChecksumCRC32C")
    if stored:
        return str(stored) == crc32c_to_base64(crc)
    return str(listed["ETag"]).strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest()


class MultipartUploads:
    """The multipart uploads of one tier's bucket: uploading in parts, resuming, aborting."""

    def __init__(self, config: TierConfig, client: S3Client, bucket: str) -> None:
        self.config = config
        self.client = client
        self.bucket = bucket
        self.buffers = PartBuffers(keep=config.multipart_concurrency + 1)

    def _list_parts(self, key: str, upload_id: str) -> dict[int, dict[str, Any]] | None:
        parts: dict[int, dict[str, Any]] = {}
        after_part = 0
        while True:
            try:
                resp = self.client.list_parts(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumberMarker=after_part
                )
            except ClientError as e:
                if is_upload_gone(e):
                    return None
                raise
            for p in resp.get("Parts", []):
                parts[int(p["PartNumber"])] = cast(dict[str, Any], p)
            if not resp.get("IsTruncated"):
                return parts
            after_part = int(resp["NextPartNumberMarker"])

    def abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            if not is_upload_gone(e):
                raise

    def abort_uploads(self, prefix: str, keys: Container[str]) -> None:
        """Abort the uploads in progress under `prefix` to one of `keys` (ours), no other."""
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for u in page.get("Uploads", []):
                if u["Key"] in keys:
                    self.abort(u["Key"], u["UploadId"])

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
                listed={n: p for n, p in parts.items() if n > done},
            )
        # S3 does not hold what the state claims: start over on a new upload.
        self.abort(key, resume.upload_id)
        return None

    def _create_upload(self, key: str) -> _Upload:
        resp = self.client.create_multipart_upload(
            Bucket=self.bucket,
            Key=key,
            ChecksumAlgorithm="CRC32C",
            ChecksumType=FULL_OBJECT,
            **object_write_args(self.config),
        )
        return _Upload(
            upload_id=resp["UploadId"],
            full_object=resp.get("ChecksumType") == FULL_OBJECT,
            offset=0,
            crc=0,
            parts={},
        )

    def _upload_part(
        self, key: str, upload_id: str, number: int, data: memoryview, crc: int
    ) -> str:
        resp = self.client.upload_part(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=cast(Any, request_body(data)),
            ContentLength=len(data),
            ChecksumAlgorithm="CRC32C",
            ChecksumCRC32C=crc32c_to_base64(crc),
        )
        return resp["ETag"]

    def upload(
        self,
        ref: ShardRef,
        key: str,
        source: ByteSource,
        size: int,
        part_size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
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
        buffers = [self.buffers.take(part_size) for _ in range(concurrency + 1)]
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
                        n = read_full(source, view, lambda: report(prefix.offset, prefix.crc))
                        if n < length:
                            raise SourceSizeMismatch(
                                f"source of {ref.path!r} ended at {offset + n} bytes, "
                                f"expected {size}"
                            )
                        number = offset // part_size + 1
                        part_crc = crc32c_of(view)
                        offset += length
                        if _already_sent(upload.listed.get(number), view, part_crc):
                            listed = upload.listed[number]
                            upload.parts[number] = (str(listed["ETag"]), crc32c_to_base64(part_crc))
                            free.append(index)
                            if prefix.add(number, part_crc, length):
                                report(prefix.offset, prefix.crc)
                            continue
                        fut = pool.submit(
                            self._upload_part, key, upload.upload_id, number, view, part_crc
                        )
                        inflight[fut] = (number, index, part_crc, length)
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
            finally:
                # Every part is back from the pool's threads (finished or cancelled) here.
                self.buffers.give(buffers)
        check_source_end(ref, source, size)
        self._complete(key, upload, size, prefix.crc)
        # Earlier attempts whose state was lost left uploads behind; the object is whole now,
        # so whatever else is pending for this key is garbage.
        self.abort_uploads(key, {key})
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
                self.abort(key, upload.upload_id)
                raise ChecksumMismatch(f"S3 refused to complete {key}: {e}") from e
            raise
        if upload.full_object:
            # Servers that accept but do not check the whole-object checksum are caught here.
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            stored = stored_crc32c(cast(dict[str, Any], head))
            if int(head["ContentLength"]) != size or (stored is not None and stored != crc):
                self.client.delete_object(Bucket=self.bucket, Key=key)
                raise ChecksumMismatch(
                    f"S3 stored {key} with size {head['ContentLength']} and crc32c "
                    f"{crc32c_hex(stored) if stored is not None else None}, "
                    f"sent {size} bytes with crc32c {crc32c_hex(crc)}"
                )
