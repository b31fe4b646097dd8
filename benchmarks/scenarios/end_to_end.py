"""Registration -> restorable on S3 through the dev stack's real workers (seal on the node, copy +
verify to the shared tier and to S3, each promoted in the catalog), against the raw work the same
bytes need: `cp -r` + `sync` local -> shared, then boto3 `upload_file` shared -> S3
(`stack_ckpt.RAW_CONFIG`), summed per run; and against a direct S3 save: boto3 `upload_file` of
the node's files straight to S3, what a job writing to S3 itself waits for after its writes.

The shards are written (and their pages dropped) before each run, untimed; the clock starts at
registration. The per-stage rows come from the catalog's `restorable_at` of each tier: "sealed"
is ssd's minus the registration's start, "ssd -> shared" lustre's minus ssd's, "sealed -> S3"
s3's minus ssd's (the S3 copy starts from the sealed copy; before the copies fanned out, it read
the shared copy once that was restorable, and this included the shared copy). The catalog's event
history of the last run is kept in the JSON (params.events) to show where the time went.
"""

from __future__ import annotations

import itertools
import shutil
import time
import uuid
from datetime import datetime
from typing import Any

from tierpoint_client.models import ShardSpec

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.stack_ckpt import (
    MiB,
    Stack,
    cp_sync,
    manifest,
    shard_names,
    write_shards,
)

RAW = "raw: cp+sync local->shared + boto3 upload shared->S3"
RAW_CP, RAW_UP = "raw: cp+sync local->shared", "raw: boto3 upload_file shared->S3"
DIRECT = "raw: boto3 upload_file local->S3 (a direct S3 save)"
TP = "tierpoint: registration -> restorable on S3"


class EndToEnd(Scenario):
    name = "end_to_end"
    summary = "registration -> restorable on S3 through the workers vs cp+sync + boto3 upload"

    def __init__(self, env: Env, mib: int, shards: int) -> None:
        self.env, self.shards = env, shards
        self.size = mib * MiB // shards
        self.nbytes = self.size * shards
        self.work = env.work / self.name
        self.job = f"e2e-{uuid.uuid4().hex[:6]}"
        self.steps = itertools.count(1)
        self.names = shard_names(shards)
        self.stack: Stack | None = None
        self.events = ""

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "shards": self.shards,
            "events of the last run (s after registration)": self.events,
        }

    def watched(self) -> Watched:
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = Stack(self.env)
        self.node = self.stack.nodes[0]
        self.block = bytes(range(256)) * (min(self.size, 16 * MiB) // 256 + 1)
        n = self.nbytes
        return [
            Method(
                RAW,
                self._raw,
                (
                    Row(RAW, "total", None, n),
                    Row(RAW_CP, "cp", None, n),
                    Row(RAW_UP, "upload", None, n),
                ),
                before=self._write_raw,
                after=self._forget,
            ),
            Method(
                DIRECT,
                self._direct,
                (Row(DIRECT, "upload", None, n),),
                before=self._write_raw,
                after=self._forget,
            ),
            Method(
                TP,
                self._tierpoint,
                (
                    Row(TP, "total", RAW, n),
                    Row(f"{TP} (vs a direct S3 save)", "total", DIRECT, n),
                    Row("tierpoint: registration -> restorable on shared", "on_shared", RAW_CP, n),
                    Row("tierpoint: registration (201)", "register", None),
                    Row("tierpoint: sealed on ssd (from registration)", "seal", None, n),
                    Row("tierpoint: ssd -> shared (verified, promoted)", "shared", RAW_CP, n),
                    Row("tierpoint: sealed -> S3 (verified, promoted)", "s3", RAW_UP, n),
                ),
                before=self._write_tierpoint,
                after=self._forget,
            ),
        ]

    def _write(self, step: int) -> list[ShardSpec]:
        assert self.stack is not None
        d = self.stack.local_dir(self.node, self.job, step)
        crcs = write_shards(d, self.names, self.size, self.block)
        drop_cache(d)
        return manifest(self.names, self.size, crcs, self.node)

    def _write_raw(self) -> None:
        self.step = next(self.steps)
        self._write(self.step)

    def _write_tierpoint(self) -> None:
        self.step = next(self.steps)
        self.shards_spec = self._write(self.step)

    def _raw(self) -> Outcome:
        assert self.stack is not None
        src = self.stack.local_dir(self.node, self.job, self.step)
        dst = self.stack.shared / self.job / str(self.step)
        t0 = time.perf_counter()
        cp_sync(src, dst)
        t1 = time.perf_counter()
        self.stack.upload(dst, f"{self.job}/{self.step}/")
        t2 = time.perf_counter()
        return Outcome({"total": t2 - t0, "cp": t1 - t0, "upload": t2 - t1})

    def _direct(self) -> Outcome:
        assert self.stack is not None
        src = self.stack.local_dir(self.node, self.job, self.step)
        t0 = time.perf_counter()
        self.stack.upload(src, f"{self.job}/{self.step}/direct/")
        return Outcome({"upload": time.perf_counter() - t0})

    def _tierpoint(self) -> Outcome:
        assert self.stack is not None
        job, step = self.job, self.step
        start = time.time()
        t0 = time.perf_counter()
        self.stack.register(job, step, self.shards_spec)
        register = time.perf_counter() - t0
        self.stack.wait(job, step, ("lustre", "s3"))
        at = self.stack.restorable_at(job, step)
        self.events = ", ".join(
            f"{e['kind']} {e['tier'] or ''} {_epoch(e['created_at']) - start:.2f}".replace(
                "  ", " "
            )
            for e in self.stack.events(job, step)
        )
        return Outcome(
            {
                "total": at["s3"] - start,
                "register": register,
                "seal": at["ssd"] - start,
                "on_shared": at["lustre"] - start,
                "shared": at["lustre"] - at["ssd"],
                "s3": at["s3"] - at["ssd"],
            }
        )

    def _forget(self) -> None:
        assert self.stack is not None
        self.stack.forget(self.job)

    def close(self) -> None:
        if self.stack is not None:
            self.stack.forget(self.job)
        shutil.rmtree(self.work, ignore_errors=True)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
