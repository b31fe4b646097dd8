"""Latency of POST /v1/jobs/{job}/checkpoints for large manifests, as a training job sends them
(one keep-alive connection, time to the full response).

The API (`tierpoint api`, its own process) runs on an embedded Postgres with the migrations and
a Temporal dev server without workers, so that the lifecycle workflows a registration starts wait
in their queue instead of loading the machine. The baseline is the idempotent retry of an
already registered manifest (200): the same body parsed, validated and compared, without the
catalog writes and the workflow start.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from benchmarks.env import Env, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from tierpoint.catalog import migrate, tokens_repo
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.nodes import upsert_node
from tierpoint.devstack.services import EmbeddedPostgres, TemporalDevServer, free_port

NODES = ("node-a", "node-b")
START_TIMEOUT = 60.0


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


class RegisterLatency(Scenario):
    name = "register_latency"
    summary = "POST a checkpoint manifest: new (201) vs idempotent retry (200), per request"

    def __init__(self, env: Env, requests: int, shards: int, warmup: int = 10) -> None:
        self.requests, self.shards, self.warmup = requests, shards, warmup
        self.work = env.work / self.name
        self.rng = random.Random(7)
        self.job = f"bench-{uuid.uuid4().hex[:8]}"
        self.step = 0
        self.registered: list[bytes] = []
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.api: subprocess.Popen[bytes] | None = None

    def params(self) -> dict[str, Any]:
        return {"requests_per_run": self.requests, "shards": self.shards, "warmup": self.warmup}

    def watched(self) -> Watched:
        found: dict[str, tuple[int, bool]] = {}
        if self.api is not None:
            found["api"] = (self.api.pid, False)
        if self.pg is not None and self.pg.pid is not None:
            found["postgres"] = (self.pg.pid, True)
        if self.temporal is not None and self.temporal.pid is not None:
            found["temporal"] = (self.temporal.pid, False)
        return found

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        url = self.pg.start()
        self.temporal = TemporalDevServer(self.work / "temporal.db")
        temporal = self.temporal.start(log_file=self.work / "temporal.log")
        migrate.upgrade(url)
        engine = make_sync_engine(url, pool_size=1)
        with Session(engine) as s:
            for n in NODES:
                upsert_node(s, n, {})
            # Requests authenticate as a training job does (TIERPOINT_TOKEN_CACHE_SECONDS=0 in
            # the environment measures a catalog lookup per request).
            token = tokens_repo.create_token(
                s, f"bench-{uuid.uuid4().hex[:8]}", ["train:bench-"], None
            ).secret
            s.commit()
        engine.dispose()
        port = free_port()
        tiers = [
            {"name": "ssd", "kind": "local", "root": str(self.work / "nodes" / "{node}")},
            {"name": "lustre", "kind": "shared", "root": str(self.work / "lustre")},
            # Never reached: the registrations' workflows wait for workers that do not run.
            {"name": "s3", "kind": "s3", "bucket": "bench", "endpoint_url": "http://127.0.0.1:9"},
        ]
        env = subprocess_env(
            {
                "TIERPOINT_DATABASE_URL": url,
                "TIERPOINT_TEMPORAL_ADDRESS": temporal,
                "TIERPOINT_TIERS": json.dumps(tiers),
                "TIERPOINT_CONFIG_FILE": str(self.work / "none.toml"),
                "TIERPOINT_LOG_LEVEL": "WARNING",
            }
        )
        tierpoint = Path(sys.executable).with_name("tierpoint")
        log = open(self.work / "api.log", "ab")  # noqa: SIM115
        self.api = subprocess.Popen(
            [str(tierpoint), "api", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
        )
        self._wait_healthy()
        self._post_new(self.warmup)
        return [
            Method("new", self._timed(self._post_new), self._rows("new", "retry")),
            Method("retry", self._timed(self._post_retry), self._rows("retry", None)),
        ]

    @staticmethod
    def _rows(label: str, base: str | None) -> tuple[Row, ...]:
        return tuple(
            Row(
                f"{label} {q}",
                metric=q,
                unit="ms",
                baseline=None if base is None else f"{base} {q}",
            )
            for q in ("p50", "p99")
        )

    def _wait_healthy(self) -> None:
        assert self.api is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if self.http.get("/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.api.poll() is not None:
                raise RuntimeError(f"the API did not start: see {self.work / 'api.log'}")
            time.sleep(0.2)

    def _post(self, body: bytes, expect: int) -> float:
        t0 = time.perf_counter()
        r = self.http.post(
            f"/v1/jobs/{self.job}/checkpoints",
            content=body,
            headers={"content-type": "application/json"},
        )
        elapsed = time.perf_counter() - t0
        if r.status_code != expect:
            raise RuntimeError(f"registration answered {r.status_code}: {r.text[:500]}")
        return elapsed

    def _post_new(self, n: int) -> list[float]:
        bodies = [manifest(self.step + i, self.shards, self.rng) for i in range(n)]
        self.step += n
        out = [self._post(b, 201) for b in bodies]
        self.registered += bodies
        return out

    def _post_retry(self, n: int) -> list[float]:
        picks = [self.rng.choice(self.registered) for _ in range(n)]
        return [self._post(b, 200) for b in picks]

    def _timed(self, post: Callable[[int], list[float]]) -> Callable[[], Outcome]:
        def run() -> Outcome:
            ms = [s * 1000 for s in post(self.requests)]
            return Outcome(
                {
                    "p50": statistics.median(ms),
                    "p99": percentile(ms, 0.99),
                }
            )

        return run

    def close(self) -> None:
        if self.api is not None:
            self.http.close()
            self.api.terminate()
            self.api.wait(10)
        if self.temporal is not None:
            self.temporal.stop()
        if self.pg is not None:
            self.pg.stop()
