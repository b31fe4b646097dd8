"""Many restores of one checkpoint at once: every node of a job asking for a lease on the same
checkpoint, as a restart storm does (each rank of an older client, a `tierpoint restore` on every
node). `leases` requests per run, `concurrency` in flight at a time, each on a connection of its
own thread, straight over HTTP (no client retries: every answer is counted, a 5xx included)
against one `tierpoint api` process on an embedded Postgres, migrated for real and filled
set-based (benchmarks/catalog_fill.py) with restorable checkpoints.

- `leases, each on another checkpoint` (the baseline): the same requests spread round-robin over
  a job's checkpoints, so that no two in flight share one;
- `leases on one checkpoint`: every request on the job's newest checkpoint;
- `releases of the leases on one checkpoint`: as many leases on the newest checkpoint taken first
  (untimed, the same way), then each released (`DELETE .../leases/{id}`, oldest first, as a
  restart storm's ranks finish in about the order they started), compared to taking them: the
  second half of a per-rank restart storm, and what a release costs beside a lease;
- `restores of the latest checkpoint`: `POST .../restores`, the step, its lease and every copy of
  its files in one request, compared to `latest restorable, no lease`, the same choice and plan
  without the lease.

Rows: p50, p99 and max latency (ms), the answers that were 5xx and the other failures (counts),
the p50 of the first and the last tenth of a run's requests (a cost that grows with the leases
held shows as a ratio above 1), the mean number of the catalog's backends waiting for a lock
while the run lasts (what serialises the requests, if anything does), and the CPU the API
process and Postgres spent per request (what bounds the latency once nothing waits: with 64 in
flight, a request waits for the 63 others' CPU on whatever share of a core the API gets).
After each run its leases and their events are deleted (untimed), so every run starts from the
same catalog.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres, free_port
from benchmarks.catalog_fill import Catalog, fill, home_node, job_name
from benchmarks.env import Env, tierpoint_env, wait_for_api
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.procs import cpu_seconds
from benchmarks.scenarios.register_latency import percentile
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.token import tokens

# The request a run sends as its i-th: (method, path, JSON body).
Request = Callable[[int], tuple[str, str, dict[str, Any] | None]]

START_TIMEOUT = 60.0
TTL = 1800
JOB = 1  # the job whose checkpoints are leased
SPREAD = "leases, each on another checkpoint"
ONE = "leases on one checkpoint"
RELEASES = "releases of the leases on one checkpoint"
RESTORES = "restores of the latest checkpoint"
LATEST = "latest restorable, no lease"
# metric -> (what, unit)
METRICS = {
    "p50": ("p50", "ms"),
    "p99": ("p99", "ms"),
    "max": ("max", "ms"),
    "5xx": ("5xx answers", "n"),
    "failed": ("other failures", "n"),
    "p50 first tenth": ("p50 of the first tenth", "ms"),
    "p50 last tenth": ("p50 of the last tenth", "ms"),
    "lock waiters": ("backends waiting for a lock (mean)", "n"),
    "api cpu": ("API CPU per request", "ms"),
    "postgres cpu": ("Postgres CPU per request", "ms"),
}


class Leases(Scenario):
    name = "leases"
    summary = "leases taken concurrently on one checkpoint, against the same spread over many"

    def __init__(self, env: Env, leases: int, concurrency: int = 64, checkpoints: int = 100):
        self.leases, self.concurrency = leases, concurrency
        self.catalog = Catalog(2, checkpoints, 8)
        self.work = env.work / self.name
        self.pg: EmbeddedPostgres | None = None
        self.api: subprocess.Popen[bytes] | None = None
        self.base = ""
        self.token = ""
        self.url = ""

    def params(self) -> dict[str, Any]:
        return {
            "requests_per_run": self.leases,
            "concurrency": self.concurrency,
            "checkpoints_of_the_job": self.catalog.checkpoints_per_job,
        }

    def watched(self) -> Watched:
        found: dict[str, tuple[int, bool]] = {}
        if self.api is not None:
            found["api"] = (self.api.pid, False)
        if self.pg is not None and self.pg.pid is not None:
            found["postgres"] = (self.pg.pid, True)
        return found

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        self.url = self.pg.start()
        migrate.upgrade(self.url)
        fill(self.url.replace("+psycopg", "", 1), self.catalog)
        self._start_api()
        job = job_name(JOB)
        newest = (self.catalog.checkpoints_per_job - 1) * 100
        steps = [k * 100 for k in range(self.catalog.checkpoints_per_job)]
        lease = {"ttl_seconds": TTL, "holder": "bench"}
        restore = {"ttl_seconds": TTL, "node": home_node(JOB)}

        def spread(i: int) -> tuple[str, str, dict[str, Any] | None]:
            return "POST", f"/v1/jobs/{job}/checkpoints/{steps[i % len(steps)]}/leases", lease

        def one(_: int) -> tuple[str, str, dict[str, Any] | None]:
            return "POST", f"/v1/jobs/{job}/checkpoints/{newest}/leases", lease

        def restores(_: int) -> tuple[str, str, dict[str, Any] | None]:
            return "POST", f"/v1/jobs/{job}/restores", restore

        def latest(_: int) -> tuple[str, str, dict[str, Any] | None]:
            return "GET", f"/v1/jobs/{job}/checkpoints/latest?node={home_node(JOB)}", None

        taken: list[int] = []

        def release(i: int) -> tuple[str, str, dict[str, Any] | None]:
            return "DELETE", f"/v1/jobs/{job}/checkpoints/{newest}/leases/{taken[i]}", None

        def take() -> None:
            """Untimed: the leases the releases end, taken as the leases method takes them."""
            self._storm(one)
            with psycopg.connect(self.url.replace("+psycopg", "", 1)) as conn:
                rows = conn.execute(
                    "SELECT id FROM restore_lease WHERE released_at IS NULL ORDER BY id"
                ).fetchall()
            taken[:] = [int(r[0]) for r in rows]
            if len(taken) != self.leases:
                raise RuntimeError(f"{len(taken)} leases taken of {self.leases}")

        return [
            self._method(SPREAD, spread, None),
            self._method(ONE, one, SPREAD),
            self._method(RELEASES, release, ONE, before=take),
            self._method(LATEST, latest, None),
            self._method(RESTORES, restores, LATEST),
        ]

    def _method(
        self,
        name: str,
        request: Request,
        baseline: str | None,
        before: Callable[[], None] | None = None,
    ) -> Method:
        rows = []
        for metric, (what, unit) in METRICS.items():
            base = f"{baseline}: {what}" if baseline is not None else None
            if metric == "p50 last tenth":
                base = f"{name}: p50 of the first tenth"
            rows.append(Row(f"{name}: {what}", metric, base, unit=unit))
        return Method(
            name, lambda: self._storm(request), tuple(rows), before=before, after=self._forget
        )

    def _storm(self, request: Request) -> Outcome:
        """`leases` requests, `concurrency` at a time, each thread on a connection of its own
        opened (and authenticated once) before the clock starts; latencies in sending order.
        Meanwhile the catalog's backends waiting for a lock are sampled."""
        headers = {"Authorization": f"Bearer {self.token}"}
        clients = [
            httpx.Client(base_url=self.base, timeout=120, headers=headers)
            for _ in range(self.concurrency)
        ]
        answers: list[tuple[float, int]] = [(0.0, 0)] * self.leases
        sent = itertools.count()
        start = threading.Barrier(self.concurrency + 1)
        stop = threading.Event()  # an interrupted run sends nothing more

        def send(http: httpx.Client) -> None:
            try:
                http.get("/v1/tiers").raise_for_status()
            except Exception:
                start.abort()  # the run fails at once, not when every thread has given up
                raise
            start.wait()
            while not stop.is_set() and (i := next(sent)) < self.leases:
                method, path, body = request(i)
                t0 = time.perf_counter()
                try:
                    status = http.request(method, path, json=body).status_code
                except httpx.HTTPError:
                    status = 0
                answers[i] = ((time.perf_counter() - t0) * 1000, status)

        threads = [threading.Thread(target=send, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        try:
            start.wait(START_TIMEOUT)
            cpu_before = self._cpu()  # after every thread's warm-up request
            waiting = self._lock_waiters(threads)
            cpu = {k: (v - cpu_before[k]) * 1000 / self.leases for k, v in self._cpu().items()}
        finally:
            stop.set()
            start.abort()  # a thread still warming up must not wait for the others
            for t in threads:
                t.join()
            for c in clients:
                c.close()
        ms = [a[0] for a in answers]
        tenth = max(1, len(ms) // 10)
        return Outcome(
            {
                "p50": percentile(ms, 0.5),
                "p99": percentile(ms, 0.99),
                "max": max(ms),
                "5xx": float(sum(1 for _, s in answers if s >= 500)),
                "failed": float(sum(1 for _, s in answers if s < 200 or 300 <= s < 500)),
                "p50 first tenth": percentile(ms[:tenth], 0.5),
                "p50 last tenth": percentile(ms[-tenth:], 0.5),
                "lock waiters": waiting,
                "api cpu": cpu["api"],
                "postgres cpu": cpu["postgres"],
            }
        )

    def _cpu(self) -> dict[str, float]:
        """CPU seconds of the API process and of Postgres with its backends: what a request
        costs whatever share of the machine the run got (its latency depends on that share)."""
        return {k: cpu_seconds(pid, tree=tree) for k, (pid, tree) in self.watched().items()}

    def _lock_waiters(self, threads: list[threading.Thread]) -> float:
        """Until the threads are done: the mean number of the catalog's backends waiting for a
        lock (a row lock that serialises requests shows here), sampled every 50 ms."""
        samples: list[int] = []
        with psycopg.connect(self.url.replace("+psycopg", "", 1), autocommit=True) as conn:
            while any(t.is_alive() for t in threads):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()
                samples.append(int(row[0]) if row else 0)
                time.sleep(0.05)
        return statistics.fmean(samples) if samples else 0.0

    def _forget(self) -> None:
        """Untimed: the run's leases and their events gone, so the next run starts alike."""
        with psycopg.connect(self.url.replace("+psycopg", "", 1), autocommit=True) as conn:
            conn.execute("DELETE FROM event WHERE kind = 'leased'")
            conn.execute("DELETE FROM restore_lease")
            conn.execute("VACUUM ANALYZE restore_lease, event")

    def _start_api(self) -> None:
        engine = make_sync_engine(self.url, pool_size=1)
        with Session(engine) as session:
            name = f"bench-{uuid.uuid4().hex[:8]}"
            self.token = tokens.create_token(session, name, ["train:job-"], None).secret
            session.commit()
        engine.dispose()
        port = free_port()
        tiers = [
            {"name": "ssd", "kind": "local", "root": str(self.work / "nodes" / "{node}")},
            {"name": "lustre", "kind": "shared", "root": str(self.work / "lustre")},
            {"name": "s3", "kind": "s3", "bucket": "bench", "endpoint_url": "http://127.0.0.1:9"},
        ]
        # Nothing listens at that Temporal address: taking a lease never needs Temporal.
        env = tierpoint_env(self.work, self.url, f"127.0.0.1:{free_port()}", tiers)
        tierpoint = Path(sys.executable).with_name("tierpoint")
        log_path = self.work / "api.log"
        with open(log_path, "ab") as log:
            self.api = subprocess.Popen(
                [str(tierpoint), "api", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=self.base, timeout=5) as http:
            wait_for_api(http, self.api, log_path, START_TIMEOUT)

    def close(self) -> None:
        if self.api is not None:
            self.api.terminate()
            try:
                self.api.wait(10)
            except subprocess.TimeoutExpired:
                self.api.kill()
                self.api.wait(10)
        if self.pg is not None:
            self.pg.stop()
