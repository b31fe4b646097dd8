"""Helpers of the tier backend tests: sources that fail part-way, progress recorders, refs and
random bytes."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterable
from typing import Any

from tierpoint.storage.base import RecordedCopy, ResumeState, ShardRef, TierStore

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


def random_bytes(n: int) -> bytes:
    return os.urandom(n)


def recorded(store: TierStore, job: str, step: int, paths: Iterable[str]) -> list[RecordedCopy]:
    """The copies as the catalog records them once it has read them (a seal: size, crc32c and
    the identity of the file read); a path with nothing there is recorded as never read."""
    out = []
    for path in paths:
        v = store.checksum(ShardRef(job, step, path))
        if v.size is None:
            out.append(RecordedCopy(path))
        else:
            out.append(RecordedCopy(path, v.size, v.crc32c, v.identity))
    return out
