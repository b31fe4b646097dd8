"""Streaming reads of one S3 object, throttled, for verification and for copies out of S3."""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from tierpoint.storage.s3.responses import error_code
from tierpoint.storage.throttle import TokenBucket

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


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
