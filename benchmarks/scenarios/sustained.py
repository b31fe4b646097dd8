"""Sustained checkpoint rate with tiny shards: each checkpoint is 2 nodes x 2 shards x 64 KiB,
written (fsynced) on both nodes' local tiers and registered as one manifest, for a fixed window,
with at most `INFLIGHT` checkpoints registered but not yet restorable on S3 (a training job that
checkpoints as often as the store keeps up). The figure is the window divided by the number of
checkpoints that became restorable on S3 inside it (seconds per checkpoint; 60 / it is
checkpoints per minute); the rest drain, untimed, after the window.

The storm: `STORM` checkpoints of the same shape, written first (untimed), then registered back to
back with nothing waiting in between, each until restorable on S3: seconds per checkpoint from
the first registration to the last one restorable on S3 (60 / it is checkpoints per minute), and
the p99 of the registrations made during it, and where a registration's time went: the API
process's CPU and its time runnable but waiting for a core (the scheduler's own accounting),
per registration, beside the mean; and the CPU each of the stack's processes spent over the
storm (from the first registration until the last checkpoint is restorable on S3) per
checkpoint, the API's including this client's polling for S3. Retention runs as it does in the
stack (a request per promotion).

The baseline does the raw work of each checkpoint in the same window, one after another: the same
writes, `cp -r` + `sync` of both nodes' shards to the shared root, boto3 `upload_file` of the four
files. The CPU columns (and `cpu_cores` in the JSON: the dev stack's workers, its API in a
process of its own, Temporal, Postgres with its backends, the stack's moto, this process) say
what limits the rate.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import deque
from typing import Any

from tierpoint_client.models import ShardSpec

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.procs import cpu_seconds, sched_seconds
from benchmarks.scenarios.stack_ckpt import WAIT, Stack, cp_sync, manifest, write_shards

KiB = 1024
SHARD = 64 * KiB
PER_NODE = 2
INFLIGHT = 16  # enough that the stack, not this bound, sets the rate
POLL = 0.05
# The storm's figures are the catalog's own times (restorable_at), not when this client saw them:
# its wait for S3 asks rarely, since each ask is API CPU taken from the stack it measures (every
# 50 ms, they were ~30 ms of the API's CPU per storm checkpoint, a tenth of the stack's).
STORM_POLL = 0.25
RAW = "raw: write + cp+sync + boto3 upload, one at a time"
TP = "tierpoint: registered -> restorable on S3"
STORM = 100
STORMED = f"tierpoint storm: {STORM} registered back to back -> all on S3"
# The stack's processes whose CPU per storm checkpoint is a row (DevStackProcess.pids).
STACK_PROCESSES = ("workers", "temporal", "api", "postgres", "moto")
CPU_ROW = "tierpoint storm: CPU per checkpoint"


class Sustained(Scenario):
    name = "sustained"
    summary = "sustained rate, 2 nodes x 2 x 64 KiB: seconds per checkpoint on S3 in a window"

    def __init__(self, env: Env, window: float) -> None:
        self.env, self.window = env, window
        self.steps = itertools.count(1)
        self.stack: Stack | None = None
        self.block = os.urandom(SHARD)

    def params(self) -> dict[str, Any]:
        return {
            "window_s": self.window,
            "checkpoint": f"2 nodes x {PER_NODE} x {SHARD // KiB} KiB",
            "in flight at most": INFLIGHT,
        }

    def watched(self) -> Watched:
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = Stack(self.env)
        self.job = f"sustained-{uuid.uuid4().hex[:6]}"
        self.nodes = self.stack.nodes[:2]
        if len(self.nodes) < 2:
            raise RuntimeError("the sustained scenario needs a dev stack of two nodes")
        return [
            Method(
                RAW,
                self._raw,
                (Row(RAW, "per_checkpoint"),),
                after=lambda: self._forget(),
            ),
            Method(
                TP,
                self._tierpoint,
                (
                    Row(TP, "per_checkpoint", RAW),
                    Row("tierpoint: registration -> S3, median of one", "latency"),
                ),
                after=lambda: self._forget(),
            ),
            Method(
                STORMED,
                self._storm,
                (
                    Row(STORMED, "per_checkpoint", RAW),
                    Row("tierpoint storm: registration p99", "register_p99"),
                    Row("tierpoint storm: registration mean", "register_mean"),
                    Row("tierpoint storm: API CPU per registration", "api_cpu"),
                    Row("tierpoint storm: API waiting for a CPU, per registration", "api_wait"),
                    Row(f"{CPU_ROW}, the stack's processes", "cpu_stack"),
                    *(Row(f"{CPU_ROW}, {name}", f"cpu_{name}") for name in STACK_PROCESSES),
                ),
                after=lambda: self._forget(),
            ),
        ]

    def _write(self, job: str, step: int) -> list[ShardSpec]:
        assert self.stack is not None
        shards: list[ShardSpec] = []
        for node in self.nodes:
            names = [f"{node}-rank{i}.bin" for i in range(PER_NODE)]
            d = self.stack.local_dir(node, job, step)
            shards += manifest(names, SHARD, write_shards(d, names, SHARD, self.block), node)
        return shards

    def _raw(self) -> Outcome:
        assert self.stack is not None
        stack, job = self.stack, f"{self.job}-raw"
        done = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.window:
            step = next(self.steps)
            self._write(job, step)
            for node in self.nodes:
                dst = stack.shared / job / str(step) / node
                cp_sync(stack.local_dir(node, job, step), dst)
                stack.upload(dst, f"{job}/{step}/{node}/")
            if time.perf_counter() - t0 <= self.window:
                done += 1
        return Outcome({"per_checkpoint": self.window / max(done, 1)})

    def _tierpoint(self) -> Outcome:
        assert self.stack is not None
        stack, job = self.stack, self.job
        inflight: deque[int] = deque()
        registered: list[int] = []
        start = time.time()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.window:
            if len(inflight) < INFLIGHT:
                step = next(self.steps)
                stack.register(job, step, self._write(job, step))
                inflight.append(step)
                registered.append(step)
                continue
            # Checkpoints of one job reach S3 about in order: the oldest one tells.
            cp = stack.client.checkpoint(job, inflight[0])
            s3 = cp.tier("s3")
            if s3 is not None and s3.state == "restorable":
                inflight.popleft()
            else:
                time.sleep(POLL)
        end = start + self.window
        for step in inflight:  # drain, untimed for the figure
            stack.client.wait_restorable(job, step, "s3", WAIT, POLL)
        times = {
            cp.step: (t.restorable_at.timestamp(), cp.created_at)
            for cp in stack.client.checkpoints(job)
            if cp.step in set(registered)
            for t in cp.tiers
            if t.tier == "s3" and t.restorable_at is not None
        }
        on_s3 = [at for at, _ in times.values() if at <= end]
        lat = sorted(
            at - created.timestamp() for at, created in times.values() if created is not None
        )
        return Outcome(
            {
                "per_checkpoint": self.window / max(len(on_s3), 1),
                "latency": lat[len(lat) // 2] if lat else float("nan"),
            }
        )

    def _storm(self) -> Outcome:
        assert self.stack is not None
        stack, job = self.stack, self.job
        steps = [next(self.steps) for _ in range(STORM)]
        written = {step: self._write(job, step) for step in steps}
        took: list[float] = []
        procs = {n: p for n, p in stack.process.pids().items() if n in STACK_PROCESSES}
        cpu = {n: cpu_seconds(pid, tree=tree) for n, (pid, tree) in procs.items()}
        api = procs.get("api", (0, False))[0]
        ran, waited = sched_seconds(api)
        start = time.time()
        for step in steps:
            t = time.perf_counter()
            stack.register(job, step, written[step])
            took.append(time.perf_counter() - t)
        ran_after, waited_after = sched_seconds(api)
        for step in steps:
            stack.client.wait_restorable(job, step, "s3", WAIT, STORM_POLL)
        spent = {
            n: (cpu_seconds(pid, tree=tree) - cpu[n]) / STORM for n, (pid, tree) in procs.items()
        }
        wanted = set(steps)
        on_s3 = [
            t.restorable_at.timestamp()
            for cp in stack.client.checkpoints(job)
            if cp.step in wanted
            for t in cp.tiers
            if t.tier == "s3" and t.restorable_at is not None
        ]
        if len(on_s3) != STORM:
            raise RuntimeError(f"{len(on_s3)} of {STORM} storm checkpoints restorable on S3")
        took.sort()
        return Outcome(
            {
                "per_checkpoint": (max(on_s3) - start) / STORM,
                "register_p99": took[min(len(took) - 1, int(0.99 * len(took)))],
                "register_mean": sum(took) / len(took),
                "api_cpu": (ran_after - ran) / STORM,
                "api_wait": (waited_after - waited) / STORM,
                "cpu_stack": sum(spent.values()),
                **{f"cpu_{n}": spent.get(n, float("nan")) for n in STACK_PROCESSES},
            }
        )

    def _forget(self) -> None:
        assert self.stack is not None
        self.stack.forget(self.job)
        self.stack.forget(f"{self.job}-raw")

    def close(self) -> None:
        if self.stack is not None:
            self._forget()
