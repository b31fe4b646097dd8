"""Latency of POST /v1/jobs/{job}/checkpoints, as a training job sends it (one keep-alive
connection, time to the full response), for manifests of 1, `shards` and 10 x `shards` shards,
with Temporal up and idle, up and busy, and down.

Two `tierpoint api` processes share one embedded Postgres with the migrations:

- `idle` and `busy` go to an API whose Temporal dev server runs without workers, so that the
  lifecycle workflows a registration starts wait in their queue instead of loading the machine;
  for `busy` another process (`python -m benchmarks.scenarios.register_latency load ADDRESS`)
  starts workflows on that server at a steady rate while the registrations are measured;
- `down` goes to an API whose Temporal server was stopped after the API had connected to it:
  every workflow start after a registration fails, and the registration must still answer 201
  (the start follows the response; the reconciler catches up later).

Baselines: a new registration at idle is compared to the idempotent retry (200) of an already
registered manifest of the same size (the same body parsed, validated and compared, without the
catalog writes and the workflow start); busy and down are compared to idle. Besides p50 and p99,
each run reports the API process's CPU per request (its threads' on-CPU time from
/proc/<pid>/task/*/schedstat, so also the workflow start that follows each response).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres, TemporalDevServer, free_port
from benchmarks.env import Env, subprocess_env, tierpoint_env, wait_for_api
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.token import tokens

NODES = ("node-a", "node-b")
START_TIMEOUT = 60.0
# Workflow starts per second of the `busy` load (the registrations' own starts come on top).
LOAD_RATE = 100
LOAD_QUEUE = "bench-load"  # no worker polls it: the load's workflows only fill the server


def manifest(step: int, shards: int, rng: random.Random) -> bytes:
    body = {
        "step": step,
        "shards": [
            {
                "path": f"model/layer-{i // 8:04d}/rank-{i % 8}.safetensors",
                "size": rng.randrange(1, 1 << 32),
                "crc32c": f"{rng.getrandbits(32):08x}",
                "node": NODES[i % len(NODES)],
            }
            for i in range(shards)
        ],
        "metadata": {"loss": 1.0 / (step + 1), "tags": ["bench"]},
    }
    return json.dumps(body).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def on_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` in nanoseconds resolution (/proc's tick counts are 10 ms,
    too coarse for a few milliseconds per request)."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
            total += int(Path(task.path, "schedstat").read_text().split()[0])
    return total / 1e9


@dataclass
class Api:
    """One `tierpoint api` process and a keep-alive client of it."""

    proc: subprocess.Popen[bytes]
    http: httpx.Client
    log: Path

    def wait_healthy(self) -> None:
        wait_for_api(self.http, self.proc, self.log, START_TIMEOUT)

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(10)


class RegisterLatency(Scenario):
    name = "register_latency"
    summary = (
        "POST a checkpoint manifest: new (201) vs idempotent retry (200), Temporal idle, busy "
        "and down, per request"
    )

    def __init__(self, env: Env, requests: int, shards: int, warmup: int = 10) -> None:
        self.requests, self.shards, self.warmup = requests, shards, warmup
        self.sizes = (1, shards, 10 * shards)
        self.work = env.work / self.name
        self.rng = random.Random(7)
        self.job = f"bench-{uuid.uuid4().hex[:8]}"
        self.step = 0
        self.registered: dict[int, list[bytes]] = {n: [] for n in self.sizes}
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.apis: dict[str, Api] = {}
        self.load: subprocess.Popen[bytes] | None = None

    def requests_for(self, shards: int) -> int:
        # The largest manifests take ~10x as long each: fewer of them keep a run's length even.
        return self.requests if shards <= self.shards else max(3, self.requests // 5)

    def params(self) -> dict[str, Any]:
        return {
            "shards": list(self.sizes),
            "requests_per_run": [self.requests_for(n) for n in self.sizes],
            "warmup": self.warmup,
            "busy_load_starts_per_s": LOAD_RATE,
        }

    def watched(self) -> Watched:
        found: dict[str, tuple[int, bool]] = {
            f"api ({k})": (a.proc.pid, False) for k, a in self.apis.items()
        }
        if self.pg is not None and self.pg.pid is not None:
            found["postgres"] = (self.pg.pid, True)
        if self.temporal is not None and self.temporal.pid is not None:
            found["temporal"] = (self.temporal.pid, False)
        if self.load is not None:
            found["load"] = (self.load.pid, False)
        return found

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        url = self.pg.start()
        self.temporal = TemporalDevServer(self.work / "temporal.db")
        self.temporal.start(log_file=self.work / "temporal.log")
        doomed = TemporalDevServer(self.work / "temporal-down.db")
        doomed.start(log_file=self.work / "temporal-down.log")
        migrate.upgrade(url)
        engine = make_sync_engine(url, pool_size=1)
        with Session(engine) as s:
            for node in NODES:
                upsert_node(s, node, {})
            # Requests authenticate as a training job does (TIERPOINT_TOKEN_CACHE_SECONDS=0 in
            # the environment measures a catalog lookup per request).
            token = tokens.create_token(
                s, f"bench-{uuid.uuid4().hex[:8]}", ["train:bench-"], None
            ).secret
            s.commit()
        engine.dispose()
        try:
            self.apis["up"] = self._start_api("up", url, self.temporal.address, token)
            self.apis["down"] = self._start_api("down", url, doomed.address, token)
            for api in self.apis.values():
                api.wait_healthy()
            for n in self.sizes:
                self._post_new(self.apis["up"], n, self.warmup)
            # The down API connects to its Temporal on its first registration; then it goes.
            self._post_new(self.apis["down"], self.sizes[0], 1)
            time.sleep(1.0)
        finally:
            doomed.stop()
        for n in self.sizes:
            self._post_new(self.apis["down"], n, min(self.warmup, 3))
        methods: list[Method] = []
        for n in self.sizes:
            up, down = self.apis["up"], self.apis["down"]
            methods += [
                Method(f"new {n}", self._timed(up, n, new=True), self._rows(f"new {n}", "retry")),
                Method(f"retry {n}", self._timed(up, n, new=False), self._rows(f"retry {n}", "")),
                Method(
                    f"new {n}, temporal busy",
                    self._timed(up, n, new=True),
                    self._rows(f"new {n}, temporal busy", f"new {n}"),
                    before=self._start_load,
                    after=self._stop_load,
                ),
                Method(
                    f"new {n}, temporal down",
                    self._timed(down, n, new=True),
                    self._rows(f"new {n}, temporal down", f"new {n}"),
                ),
            ]
        return methods

    def _start_api(self, label: str, url: str, temporal: str, token: str) -> Api:
        port = free_port()
        tiers = [
            {"name": "ssd", "kind": "local", "root": str(self.work / "nodes" / "{node}")},
            {"name": "lustre", "kind": "shared", "root": str(self.work / "lustre")},
            # Never reached: the registrations' workflows wait for workers that do not run.
            {"name": "s3", "kind": "s3", "bucket": "bench", "endpoint_url": "http://127.0.0.1:9"},
        ]
        env = tierpoint_env(self.work, url, temporal, tiers)
        tierpoint = Path(sys.executable).with_name("tierpoint")
        log_path = self.work / f"api-{label}.log"
        log = open(log_path, "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(tierpoint), "api", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=60,
            headers={"Authorization": f"Bearer {token}"},
        )
        return Api(proc, http, log_path)

    @staticmethod
    def _rows(label: str, base: str) -> tuple[Row, ...]:
        # base: "retry" compares to the retry of the same size, "" to nothing, else that method.
        size = label.split(",")[0].split()[-1]
        ref = f"retry {size}" if base == "retry" else base

        def baseline(q: str) -> str | None:
            return f"{ref} {q}" if ref else None

        return (
            Row(f"{label} p50", metric="p50", unit="ms", baseline=baseline("p50")),
            Row(f"{label} p99", metric="p99", unit="ms", baseline=baseline("p99")),
            Row(
                f"{label} API CPU/request",
                metric="cpu",
                unit="ms",
                baseline=baseline("API CPU/request"),
            ),
        )

    def _start_load(self) -> None:
        assert self.temporal is not None
        self.load = subprocess.Popen(
            [sys.executable, "-m", __name__, "load", self.temporal.address, str(LOAD_RATE)],
            env=subprocess_env({}),
            stdout=subprocess.PIPE,
            stderr=open(self.work / "load.log", "ab"),  # noqa: SIM115
        )
        assert self.load.stdout is not None
        # Measure only once the load runs (its first start answered).
        if not self.load.stdout.readline():
            raise RuntimeError(f"the Temporal load did not start: see {self.work / 'load.log'}")

    def _stop_load(self) -> None:
        if self.load is not None:
            self.load.terminate()
            self.load.wait(10)
            self.load = None

    def _post(self, api: Api, body: bytes, expect: int) -> float:
        t0 = time.perf_counter()
        r = api.http.post(
            f"/v1/jobs/{self.job}/checkpoints",
            content=body,
            headers={"content-type": "application/json"},
        )
        elapsed = time.perf_counter() - t0
        if r.status_code != expect:
            raise RuntimeError(f"registration answered {r.status_code}: {r.text[:500]}")
        return elapsed

    def _bodies(self, shards: int, n: int) -> list[bytes]:
        bodies = [manifest(self.step + i, shards, self.rng) for i in range(n)]
        self.step += n
        return bodies

    def _post_new(self, api: Api, shards: int, n: int) -> list[float]:
        bodies = self._bodies(shards, n)
        out = [self._post(api, b, 201) for b in bodies]
        self.registered[shards] += bodies
        return out

    def _timed(self, api: Api, shards: int, *, new: bool) -> Callable[[], Outcome]:
        def run() -> Outcome:
            n = self.requests_for(shards)
            if new:
                bodies, expect = self._bodies(shards, n), 201
            else:
                bodies, expect = [self.rng.choice(self.registered[shards]) for _ in range(n)], 200
            cpu0 = on_cpu_seconds(api.proc.pid)
            ms = [self._post(api, b, expect) * 1000 for b in bodies]
            cpu = on_cpu_seconds(api.proc.pid) - cpu0
            if new:
                self.registered[shards] += bodies
            return Outcome(
                {
                    "p50": statistics.median(ms),
                    "p99": percentile(ms, 0.99),
                    "cpu": cpu / n * 1000,
                }
            )

        return run

    def close(self) -> None:
        self._stop_load()
        for api in self.apis.values():
            api.close()
        if self.temporal is not None:
            self.temporal.stop()
        if self.pg is not None:
            self.pg.stop()


async def _load(address: str, rate: float) -> None:
    """Start workflows at `rate` per second (no worker runs them) until terminated."""
    from temporalio.client import Client

    client = await Client.connect(address)
    interval, started = 1.0 / rate, 0
    pending: set[asyncio.Task[Any]] = set()
    t0 = time.monotonic()
    while True:
        task = asyncio.create_task(
            client.start_workflow(
                "BenchLoad", id=f"bench-load-{uuid.uuid4().hex}", task_queue=LOAD_QUEUE
            )
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
        if started == 0:
            await task
            print("running", flush=True)
        started += 1
        await asyncio.sleep(max(0.0, t0 + started * interval - time.monotonic()))


if __name__ == "__main__":
    if sys.argv[1:2] != ["load"] or len(sys.argv) != 4:
        raise SystemExit("usage: python -m benchmarks.scenarios.register_latency load ADDRESS RATE")
    asyncio.run(_load(sys.argv[2], float(sys.argv[3])))
