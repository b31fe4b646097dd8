"""The catalog's read paths at scale, through HTTP: the operator views, the latest restorable
checkpoint with its restore plan, a page of a job's checkpoints.

Two catalogs in one embedded Postgres (two databases, migrated for real): 1x (1,000 jobs, 100,000
checkpoints, 1,000,000 shards, 3,000,000 replicas in the full run) and 10x the checkpoints and
shards of the same jobs, each filled set-based (benchmarks/catalog_fill.py) and served by its
own `tierpoint api` with authentication on. Each method sends `requests` GETs over one
keep-alive connection and reports p50, p99 and max. The 10x rows are compared to the same
request on the 1x catalog (the growth ratio); the 1x rows to a trivial authenticated GET
(/v1/tiers) on the same server, both measured in this run.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres, free_port
from benchmarks.catalog_fill import Catalog, fill, home_node, job_name
from benchmarks.env import Env, tierpoint_env, wait_for_api
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.register_latency import percentile
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.token import tokens

START_TIMEOUT = 60.0
SCALES = (("1x", 1), ("10x", 10))
QUANTILES = ("p50", "p99", "max")
# The overview's deep page: the page that starts after this fraction of the jobs.
DEEP = 0.9
OVERVIEW_LIMIT = 50
TRIVIAL = "GET /v1/tiers"  # the baseline: authentication and routing, no catalog read


@dataclass
class Served:
    """One catalog and the API that serves it."""

    label: str
    catalog: Catalog
    url: str
    database: str
    api: subprocess.Popen[bytes] | None = None
    http: httpx.Client | None = None
    deep_cursor: str | None = None


class CatalogReads(Scenario):
    name = "catalog_reads"
    summary = "catalog reads over HTTP at 1x and 10x checkpoints/shards, per request"

    def __init__(self, env: Env, base: Catalog, requests: int, warmup: int = 20) -> None:
        self.base, self.requests, self.warmup = base, requests, warmup
        self.work = env.work / self.name
        self.rng = random.Random(11)
        self.pg: EmbeddedPostgres | None = None
        self.served: list[Served] = []
        self.fill_seconds: dict[str, dict[str, float]] = {}

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests_per_run": self.requests}
        for s in self.served:
            c = s.catalog
            out[s.label] = f"{c.jobs} jobs/{c.checkpoints} checkpoints/{c.shards} shards"
            out[f"fill {s.label} s"] = round(sum(self.fill_seconds.get(s.label, {}).values()), 1)
        return out

    def watched(self) -> Watched:
        found: dict[str, tuple[int, bool]] = {}
        for s in self.served:
            if s.api is not None:
                found[f"api {s.label}"] = (s.api.pid, False)
        if self.pg is not None and self.pg.pid is not None:
            found["postgres"] = (self.pg.pid, True)
        return found

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        admin = self.pg.start()
        libpq = admin.replace("postgresql+psycopg://", "postgresql://", 1)
        for label, factor in SCALES:
            db = f"catalog_{label}"
            url = admin.replace("/tierpoint?", f"/{db}?", 1)
            with psycopg.connect(libpq, autocommit=True) as conn:
                if not self.served:
                    conn.execute(f'CREATE DATABASE "{db}"')
                    migrate.upgrade(url)
                else:  # a copy of the first, migrated and still empty: one migration run
                    conn.execute(f'CREATE DATABASE "{db}" TEMPLATE "{self.served[0].database}"')
            c = self.base
            catalog = Catalog(c.jobs, c.checkpoints_per_job * factor, c.shards_per_checkpoint)
            self.served.append(Served(label, catalog, url, db))
        # Both catalogs at once: each fill is one backend, mostly on one core.
        with ThreadPoolExecutor(len(self.served)) as pool:
            took = pool.map(
                lambda s: fill(s.url.replace("+psycopg", "", 1), s.catalog), self.served
            )
            self.fill_seconds = {s.label: t for s, t in zip(self.served, took, strict=True)}
        for s in self.served:
            self._start_api(s)
        for s in self.served:
            self._await_api(s)
        methods: list[Method] = []
        for name, request in self._requests().items():
            for s in self.served:
                base = (name, "1x") if s.label != "1x" else (TRIVIAL, "1x")
                rows = self._rows(name, s.label, None if base == (name, s.label) else base)
                methods.append(Method(f"{name} @{s.label}", self._timed(s, request), rows))
        return methods

    @staticmethod
    def _rows(name: str, scale: str, base: tuple[str, str] | None) -> tuple[Row, ...]:
        return tuple(
            Row(
                f"{name} {q} @{scale}",
                metric=q,
                unit="ms",
                baseline=f"{base[0]} {q} @{base[1]}" if base is not None else None,
            )
            for q in QUANTILES
        )

    def _requests(self) -> dict[str, Callable[[Served], str]]:
        """Request name -> the path of one request of it (drawn afresh each time)."""
        jobs = self.base.jobs

        def some_job() -> int:
            return self.rng.randrange(1, jobs + 1)

        def latest(_: Served) -> str:
            j = some_job()
            return f"/v1/jobs/{job_name(j)}/checkpoints/latest?node={home_node(j)}"

        def deep(s: Served) -> str:
            assert s.deep_cursor is not None
            return f"/v1/overview/jobs?limit={OVERVIEW_LIMIT}&cursor={s.deep_cursor}"

        return {
            TRIVIAL: lambda _: "/v1/tiers",
            "overview first page": lambda _: f"/v1/overview/jobs?limit={OVERVIEW_LIMIT}",
            "overview deep page": deep,
            "copies in flight": lambda _: "/v1/copies/in-flight",
            "failures": lambda _: "/v1/failures",
            "latest restorable": latest,
            "checkpoints limit=50": lambda _: (
                f"/v1/jobs/{job_name(some_job())}/checkpoints?limit=50"
            ),
        }

    def _start_api(self, s: Served) -> None:
        engine = make_sync_engine(s.url, pool_size=1)
        with Session(engine) as session:
            token = tokens.create_token(
                session, f"bench-{uuid.uuid4().hex[:8]}", ["read"], None
            ).secret
            session.commit()
        engine.dispose()
        port = free_port()
        tiers = [
            {"name": "ssd", "kind": "local", "root": str(self.work / "nodes" / "{node}")},
            {"name": "lustre", "kind": "shared", "root": str(self.work / "lustre")},
            {"name": "s3", "kind": "s3", "bucket": "bench", "endpoint_url": "http://127.0.0.1:9"},
        ]
        # Nothing listens at that Temporal address: reads never need Temporal, and the API serves
        # without it.
        env = tierpoint_env(self.work, s.url, f"127.0.0.1:{free_port()}", tiers)
        tierpoint = Path(sys.executable).with_name("tierpoint")
        log_path = self.work / f"api-{s.label}.log"
        log = open(log_path, "ab")  # noqa: SIM115
        s.api = subprocess.Popen(
            [str(tierpoint), "api", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        s.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=60,
            headers={"Authorization": f"Bearer {token}"},
        )

    def _await_api(self, s: Served) -> None:
        assert s.api is not None and s.http is not None
        wait_for_api(s.http, s.api, self.work / f"api-{s.label}.log", START_TIMEOUT)
        # The deep page's cursor, reached the way a client reaches it: page by page.
        cursor: str | None = None
        for _ in range(int(s.catalog.jobs * DEEP) // OVERVIEW_LIMIT):
            q = f"/v1/overview/jobs?limit={OVERVIEW_LIMIT}" + (
                f"&cursor={cursor}" if cursor else ""
            )
            cursor = self._get(s, q).json()["next_cursor"]
        s.deep_cursor = cursor
        self._check(s)

    def _check(self, s: Served) -> None:
        """What the catalog was filled with is what the API reports (else the timings measure
        an empty answer)."""
        jobs = self.base.jobs
        in_flight = self._get(s, "/v1/copies/in-flight?limit=1000").json()["items"]
        if len(in_flight) != min(jobs // 5, 1000) or {i["tier"] for i in in_flight} != {"s3"}:
            raise RuntimeError(f"{s.label}: unexpected copies in flight: {len(in_flight)}")
        if not self._get(s, "/v1/failures").json()["items"]:
            raise RuntimeError(f"{s.label}: no failures in the catalog")
        newest = (s.catalog.checkpoints_per_job - 1) * 100
        latest = self._get(s, f"/v1/jobs/{job_name(2)}/checkpoints/latest?node={home_node(2)}")
        body = latest.json()
        if body["step"] != newest or len(body["plan"]) != s.catalog.shards_per_checkpoint:
            raise RuntimeError(f"{s.label}: unexpected latest restorable: {latest.text[:300]}")
        page = self._get(s, f"/v1/jobs/{job_name(1)}/checkpoints?limit=50").json()
        if len(page["items"]) != min(50, s.catalog.checkpoints_per_job):
            raise RuntimeError(f"{s.label}: unexpected page of checkpoints")
        if s.deep_cursor is None and jobs > OVERVIEW_LIMIT:
            raise RuntimeError(f"{s.label}: the overview has no deep page")

    def _get(self, s: Served, path: str) -> httpx.Response:
        assert s.http is not None
        r = s.http.get(path)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path} answered {r.status_code}: {r.text[:500]}")
        return r

    def _timed(self, s: Served, request: Callable[[Served], str]) -> Callable[[], Outcome]:
        def run() -> Outcome:
            for _ in range(self.warmup):
                self._get(s, request(s))
            ms = []
            for _ in range(self.requests):
                path = request(s)
                t0 = time.perf_counter()
                self._get(s, path)
                ms.append((time.perf_counter() - t0) * 1000)
            return Outcome(
                {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms)}
            )

        return run

    def close(self) -> None:
        for s in self.served:
            if s.http is not None:
                s.http.close()
            if s.api is not None:
                s.api.terminate()
                try:
                    s.api.wait(10)
                except subprocess.TimeoutExpired:
                    s.api.kill()
                    s.api.wait(10)
        if self.pg is not None:
            self.pg.stop()
