"""Fixtures for the tier backends: real directories under tmp_path, the session's real moto S3."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.conftest import Services, make_bucket
from tierpoint.config import TierConfig, TierKind
from tierpoint.storage.base import ResumeState, ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import s3_client
from tierpoint.storage.s3.store import S3Store

MiB = 1024 * 1024


class InterruptedSource(io.RawIOBase):
    """A source reader over bytes that starts at `start` and fails once `fail_after` bytes have
    been handed out: the copy dies mid-way like a worker that lost its disk or its process."""

    def __init__(self, data: bytes, start: int = 0, fail_after: int | None = None) -> None:
        super().__init__()
        self._data = data
        self._pos = start
        self.start = start
        self.first_read_at: int | None = None
        self.seeks: list[int] = []
        self._left = fail_after

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.first_read_at is None:
            self.first_read_at = self._pos
        n = min(len(buffer), len(self._data) - self._pos)
        if self._left is not None:
            if self._left <= 0:
                raise OSError("source device went away")
            n = min(n, self._left)
            self._left -= n
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        assert whence == io.SEEK_SET
        self.seeks.append(offset)
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos


class Progress:
    def __init__(self) -> None:
        self.states: list[ResumeState] = []

    def __call__(self, state: ResumeState) -> None:
        self.states.append(state)

    @property
    def last(self) -> ResumeState:
        return self.states[-1]


def new_ref(path: str = "model/rank-0.bin") -> ShardRef:
    return ShardRef(job=f"job-{uuid.uuid4().hex[:8]}", step=100, path=path)


@pytest.fixture
def shared_root(tmp_path: Path) -> Path:
    root = tmp_path / "lustre"
    root.mkdir()
    return root


@pytest.fixture
def posix_store(shared_root: Path) -> PosixStore:
    # Small buffers so that a few MiB make many chunks (and many resume points).
    tier = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(shared_root))
    return PosixStore(tier, buffer_size=256 * 1024)


@pytest.fixture
def s3_tier(services: Services) -> TierConfig:
    return TierConfig(
        name="s3",
        kind=TierKind.S3,
        bucket=make_bucket(services),
        prefix="ckpt/",
        endpoint_url=services.s3_endpoint_url,
        region=services.s3_region,
        multipart_part_size=5 * MiB,
        multipart_concurrency=2,
    )


@pytest.fixture
def s3_store(s3_tier: TierConfig) -> S3Store:
    return S3Store(s3_tier, s3_client(s3_tier.endpoint_url, s3_tier.region))


@pytest.fixture
def raw_s3(services: Services) -> Any:
    """A plain boto3 client, as another program (or an attacker) would use the bucket."""
    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.s3_region,
        aws_access_key_id=services.s3_access_key_id,
        aws_secret_access_key=services.s3_secret_access_key,
    )


def random_bytes(n: int) -> bytes:
    return os.urandom(n)
