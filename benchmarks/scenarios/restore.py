"""Restore of one checkpoint into a fresh directory with the client (`Client.restore(job, dest,
tier=...)`: the latest plan, every shard checked against its registered crc32c, fsynced, renamed
into place) from the shared tier and from S3, against `cp -r` + `sync` of the shared tier's copy
and boto3 `download_file` of the same S3 objects (`stack_ckpt.RAW_CONFIG`) + `sync`.

The checkpoint (the end_to_end size) is registered once and waited for until it is restorable on
S3. Page caches of the shared copy and of the destinations are dropped before each run; each
destination is removed after it. The target is a throughput of at least 0.9x the baseline's, a
time ratio of at most 1.11.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.stack_ckpt import (
    MiB,
    Stack,
    cp_sync,
)

CP = "cp -r + sync from the shared tier"
BOTO3 = "boto3 download_file from S3 + sync"
STEP = 1


class Restore(Scenario):
    name = "restore"
    summary = "restore to a fresh directory: Client.restore(tier=) vs cp -r and boto3 downloads"

    def __init__(self, env: Env, mib: int, shards: int) -> None:
        self.env, self.shards = env, shards
        self.size = mib * MiB // shards
        self.nbytes = self.size * shards
        self.work = env.work / self.name
        self.job = f"restore-{uuid.uuid4().hex[:6]}"
        self.stack: Stack | None = None

    def params(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "shards": self.shards, "client workers": 4}

    def watched(self) -> Watched:
        # Client.restore runs in this process: its threads count as "bench".
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = stack = Stack(self.env)
        stack.restorable_everywhere(self.job, STEP, self.shards, self.size)
        self.work.mkdir(parents=True)
        n = self.nbytes
        return [
            self._method(CP, self._cp, Row(CP, nbytes=n)),
            self._method(BOTO3, self._boto3, Row(BOTO3, nbytes=n)),
            self._method(
                "Client.restore(tier=lustre)",
                lambda: self._client("lustre"),
                Row("Client.restore from the shared tier", baseline=CP, nbytes=n),
            ),
            self._method(
                "Client.restore(tier=s3)",
                lambda: self._client("s3"),
                Row("Client.restore from S3", baseline=BOTO3, nbytes=n),
            ),
        ]

    def _method(self, name: str, run: Callable[[], Outcome], row: Row) -> Method:
        return Method(name, run, (row,), before=self._drop, after=self._clear)

    @property
    def dest(self) -> Path:
        return self.work / "dest"

    def _drop(self) -> None:
        assert self.stack is not None
        drop_cache(self.stack.shared / self.job)

    def _clear(self) -> None:
        drop_cache(self.dest)
        shutil.rmtree(self.dest, ignore_errors=True)

    def _cp(self) -> Outcome:
        assert self.stack is not None
        t0 = time.perf_counter()
        cp_sync(self.stack.shared / self.job / str(STEP), self.dest)
        return Outcome({"seconds": time.perf_counter() - t0})

    def _boto3(self) -> Outcome:
        assert self.stack is not None
        t0 = time.perf_counter()
        self.stack.download(f"{self.job}/{STEP}/", self.dest)
        return Outcome({"seconds": time.perf_counter() - t0})

    def _client(self, tier: str) -> Outcome:
        assert self.stack is not None
        t0 = time.perf_counter()
        result = self.stack.client.restore(self.job, self.dest, tier=tier)
        seconds = time.perf_counter() - t0
        if result.bytes_total != self.nbytes or result.step != STEP:
            raise RuntimeError(f"restore from {tier} returned {result.bytes_total} B")
        return Outcome({"seconds": seconds})

    def close(self) -> None:
        if self.stack is not None:
            self.stack.forget(self.job)
        shutil.rmtree(self.work, ignore_errors=True)
