"""The time a checkpoint costs training: write N shards to the node's local tier (fsynced) and
register them (until the API has answered 201), against uploading the same bytes straight to S3
with boto3 (`upload_file`, the transfer settings of `stack_ckpt.RAW_CONFIG`), to the S3 endpoint
of the dev stack's own tier.

Two ways to register: with the crc32c computed while writing (`register_manifest`, what
TierpointWriter does) and with the client hashing the written files (`register`, a re-read from
the page cache). The floor is the same shards written and fsynced to the same local tier with
nothing of ours (no checksum, no registration): its ratio to boto3 is the best any change of
ours could reach on this machine, and the tierpoint rows are compared with it too. After each
tierpoint run the harness waits, untimed, until the checkpoint is restorable on S3, then removes
its copies, so no background copy runs into the next measurement.
"""

from __future__ import annotations

import itertools
import shutil
import time
import uuid
from typing import Any

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.stack_ckpt import (
    MiB,
    Stack,
    manifest,
    shard_names,
    write_shards,
)

BOTO3 = "boto3 upload_file straight to S3"
FLOOR = "floor: write+fsync to the local tier, nothing of ours"


class CheckpointVisible(Scenario):
    name = "checkpoint_visible"
    summary = "training-visible checkpoint time: write shards locally + register vs boto3 to S3"

    def __init__(self, env: Env, mib: int, shards: int) -> None:
        self.env, self.shards = env, shards
        self.size = mib * MiB // shards
        self.nbytes = self.size * shards
        self.work = env.work / self.name
        self.job = f"visible-{uuid.uuid4().hex[:6]}"
        self.steps = itertools.count(1)
        self.names = shard_names(shards)
        self.stack: Stack | None = None

    def params(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "shards": self.shards, "node": "node-1"}

    def watched(self) -> Watched:
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = stack = Stack(self.env)
        self.node = stack.nodes[0]
        self.block = bytes(range(256)) * (min(self.size, 16 * MiB) // 256 + 1)
        self.src = self.work / "src"
        write_shards(self.src, self.names, self.size, self.block)
        n = self.nbytes
        hash_on_write = "write+fsync, register (crc32c while writing)"
        client_hash = "write+fsync, register (client hashes)"
        return [
            Method(
                BOTO3,
                self._boto3,
                (Row(BOTO3, nbytes=n),),
                after=lambda: stack.forget("raw"),
            ),
            Method(FLOOR, self._floor, (Row(FLOOR, "seconds", BOTO3, n),), after=self._unfloor),
            Method(
                hash_on_write,
                lambda: self._tierpoint(hashed=True),
                (
                    Row(hash_on_write, "total", BOTO3, n),
                    Row(f"{hash_on_write} (vs the floor)", "total", FLOOR, n),
                    Row(f"{hash_on_write}: of which register", "register", BOTO3),
                ),
                after=self._settle,
            ),
            Method(
                client_hash,
                lambda: self._tierpoint(hashed=False),
                (
                    Row(client_hash, "total", BOTO3, n),
                    Row(f"{client_hash} (vs the floor)", "total", FLOOR, n),
                    Row(f"{client_hash}: of which hash+register", "register", BOTO3),
                ),
                after=self._settle,
            ),
        ]

    def _boto3(self) -> Outcome:
        assert self.stack is not None
        t0 = time.perf_counter()
        self.stack.upload(self.src, f"raw/{next(self.steps)}/")
        return Outcome({"seconds": time.perf_counter() - t0})

    def _floor(self) -> Outcome:
        assert self.stack is not None
        # The same node's local tier (the same filesystem), in a directory no tier copies.
        d = self.stack.local_dir(self.node, f"{self.job}-floor", next(self.steps))
        t0 = time.perf_counter()
        write_shards(d, self.names, self.size, self.block, crc=False)
        return Outcome({"seconds": time.perf_counter() - t0})

    def _unfloor(self) -> None:
        assert self.stack is not None
        self.stack.forget(f"{self.job}-floor")

    def _tierpoint(self, hashed: bool) -> Outcome:
        assert self.stack is not None
        step = next(self.steps)
        self.last = step
        d = self.stack.local_dir(self.node, self.job, step)
        t0 = time.perf_counter()
        crcs = write_shards(d, self.names, self.size, self.block)
        t1 = time.perf_counter()
        if hashed:
            self.stack.register(self.job, step, manifest(self.names, self.size, crcs, self.node))
        else:
            body = self.stack.client.register(self.job, step, d, self.node)
            if body.get("step") != step:
                raise RuntimeError(f"registration of {self.job}/{step} answered {body}")
        t2 = time.perf_counter()
        return Outcome({"total": t2 - t0, "register": t2 - t1})

    def _settle(self) -> None:
        assert self.stack is not None
        self.stack.wait(self.job, self.last)
        self.stack.forget(self.job)

    def close(self) -> None:
        if self.stack is not None:
            self.stack.forget(self.job)
            self.stack.forget(f"{self.job}-floor")
            self.stack.forget("raw")
        shutil.rmtree(self.work, ignore_errors=True)
