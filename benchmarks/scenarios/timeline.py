"""A run's timeline at scale: `latest?health=good` against plain `latest`, and a rollback.

One job in an embedded Postgres (migrated for real) with `checkpoints` checkpoints over
`branches` branches, filled set-based: each branch holds checkpoints/branches consecutive steps
and starts GO_BACK steps before its parent's newest, whose later checkpoints it supersedes (so
the timeline is the newest branch plus, before each branch point, its ancestors'); one
checkpoint in GOOD_EVERY has a good verdict; every checkpoint has one shard, verified and
restorable on a shared tier. The catalog functions the API calls are timed on one session
(no HTTP: the ratio is the catalog's own, which HTTP would only dilute):

- `latest` and `latest?health=good`: after WARM_UP untimed rounds, `samples` rounds answer
  both, in alternating order, so that a stall of a shared machine hits both alike; p50 and p99
  of each; the ratio of their p99 is the target (within 1.2x);
- a rollback: before each, untimed, ROLLBACK_SPAN new checkpoints are saved on the current
  branch; the rollback to the step before them (which supersedes them) and its commit are timed,
  apart (statements, commit) and together, with the CPU this process spent on the statements;
  p99 of `samples` / 4 rollbacks after WARM_UP (target: under 50 ms); then the statements one
  rollback runs over ROLLBACK_SPAN and over LONG_SPAN checkpoints (the same number: a rollback is
  not a statement per checkpoint);
- the load average (1 minute) at the end of each method, beside its numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres
from benchmarks.harness import Method, Outcome, Row, Scenario
from benchmarks.scenarios.register_latency import percentile
from tierpoint.catalog import migrate, usage_rollup
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.timeline.branches import rollback
from tierpoint.tier_config import TierConfig, TierKind

JOB = "timeline-bench"
GO_BACK = 20
GOOD_EVERY = 50
ROLLBACK_SPAN = 5
# Untimed rounds first (the plans cached, the index pages read in); the samples per run are the
# harness's (2,000 rounds of reads, a quarter as many rollbacks: a p99 that is not the one or two
# slowest of a run, as the 99th of 100 rollbacks was).
WARM_UP = 50
LONG_SPAN = 1_000  # a rollback over a long tail: its statements are counted, not timed

_FILL = """
WITH b AS (
  SELECT g AS branch, (g - 1) * (%(per)s - %(back)s) AS first FROM generate_series(1, %(nb)s) g
)
INSERT INTO checkpoint (job_id, branch, step, superseded_by, health, total_bytes, shard_count,
                        manifest_digest, workflow_started_at, created_at)
SELECT %(job)s, b.branch, b.first + k,
       CASE WHEN b.branch < %(nb)s AND k > %(per)s - %(back)s THEN b.branch + 1 END,
       CASE WHEN (b.first + k) %% %(good)s = 0 THEN 'good' END,
       100, 1, md5((b.branch::bigint * 1000003 + k)::text) || md5(k::text), now(),
       now() - interval '1 second' * (%(total)s - (b.branch - 1) * %(per)s - k)
FROM b, generate_series(1, %(per)s) k
"""
_SHARDS = """
INSERT INTO shard (checkpoint_id, ordinal, path, size, checksum, node_id)
SELECT id, 0, 'model.bin', 100, '0badf00d', 'node-a' FROM checkpoint WHERE job_id = %(job)s
"""
_COPIES = """
INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state, restorable_at, superseded)
SELECT id, 'lustre', job_id, step, 'restorable', now(), superseded_by IS NOT NULL
FROM checkpoint WHERE job_id = %(job)s
"""
_REPLICAS = """
INSERT INTO replica (shard_id, checkpoint_id, tier, state, location, bytes_done, verified_at)
SELECT s.id, s.checkpoint_id, 'lustre', 'verified', '/lustre/x', 100, now()
FROM shard s JOIN checkpoint c ON c.id = s.checkpoint_id WHERE c.job_id = %(job)s
"""
_BRANCHES = """
INSERT INTO branch (job_id, number, parent, from_step)
SELECT %(job)s, g, CASE WHEN g > 1 THEN g - 1 END,
       CASE WHEN g > 1 THEN (g - 1) * (%(per)s - %(back)s) END
FROM generate_series(1, %(nb)s) g
"""
# New checkpoints on the current branch after its newest step, restorable (a rollback's prey).
_SAVE = """
WITH head AS (
  SELECT j.id AS job_id, j.current_branch AS branch,
         (SELECT max(c.step) FROM checkpoint c
          WHERE c.job_id = j.id AND c.superseded_by IS NULL) AS step
  FROM job j WHERE j.id = :job
), made AS (
  INSERT INTO checkpoint (job_id, branch, step, total_bytes, shard_count, manifest_digest)
  SELECT head.job_id, head.branch, head.step + k, 100, 1, md5(random()::text)
  FROM head, generate_series(1, :n) k RETURNING id, job_id, step
)
INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state, restorable_at)
SELECT id, 'lustre', job_id, step, 'restorable', now() FROM made
"""
LUSTRE = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")


@contextmanager
def _counting(engine: Engine) -> Iterator[list[int]]:
    """The statements the server runs meanwhile (an executemany once per row, as it runs)."""
    ran: list[int] = []

    def count(_c: Any, _cur: Any, _stmt: str, params: Any, _ctx: Any, many: bool) -> None:
        ran.append(len(params) if many else 1)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield ran
    finally:
        event.remove(engine, "before_cursor_execute", count)


class Timeline(Scenario):
    name = "timeline"
    summary = "latest?health=good vs latest, and a rollback, on a job of many branches"

    def __init__(self, work: Path, checkpoints: int, branches: int, samples: int) -> None:
        self.work, self.checkpoints, self.branches = work, checkpoints, branches
        self.reads, self.rollbacks = samples, max(samples // 4, 20)
        self.pg: EmbeddedPostgres | None = None
        self.fill_seconds = 0.0

    def params(self) -> dict[str, Any]:
        return {
            "checkpoints": self.checkpoints,
            "branches": self.branches,
            "good_every": GOOD_EVERY,
            "reads_per_run": self.reads,
            "rollbacks_per_run": self.rollbacks,
            "fill_seconds": round(self.fill_seconds, 1),
        }

    def _fill(self, libpq: str) -> int:
        t0 = time.perf_counter()
        per = self.checkpoints // self.branches
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            # As benchmarks/catalog_fill.py loads: no per-row trigger (foreign keys, the usage
            # totals, which one statement backfills after), every row consistent by construction.
            conn.execute("SET session_replication_role = replica")
            job_id = conn.execute(
                "INSERT INTO job (name, current_branch) VALUES (%s, %s) RETURNING id",
                (JOB, self.branches),
            ).fetchone()
            assert job_id is not None
            args = {
                "job": job_id[0],
                "per": per,
                "back": GO_BACK,
                "nb": self.branches,
                "good": GOOD_EVERY,
                "total": self.checkpoints,
            }
            for sql in (_FILL, _SHARDS, _COPIES, _REPLICAS, _BRANCHES, usage_rollup.BACKFILL):
                conn.execute(sql, args)
            conn.execute("VACUUM (ANALYZE)")
        self.fill_seconds = time.perf_counter() - t0
        return int(job_id[0])

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        url = self.pg.start()
        migrate.upgrade(url)
        job_id = self._fill(url.replace("postgresql+psycopg://", "postgresql://", 1))
        engine = make_sync_engine(url)

        def reads() -> Outcome:
            return Outcome(self._reads(engine))

        def rollbacks() -> Outcome:
            return Outcome(self._rollbacks(engine, job_id))

        return [
            Method(
                "latest, latest?health=good",
                reads,
                (
                    Row("latest p50", metric="latest p50", unit="ms"),
                    Row("latest p99", metric="latest p99", unit="ms"),
                    Row("latest?health=good p50", metric="latest?health=good p50", unit="ms"),
                    Row("load average (1 min), reads", metric="load average", unit="n"),
                    Row(
                        "latest?health=good p99",
                        metric="latest?health=good p99",
                        baseline="latest p99",
                        unit="ms",
                    ),
                ),
            ),
            Method(
                "rollback",
                rollbacks,
                (
                    Row("rollback p50", metric="rollback p50", unit="ms"),
                    Row("rollback p99", metric="rollback p99", unit="ms"),
                    Row("rollback statements p50", metric="statements p50", unit="ms"),
                    Row("rollback statements p99", metric="statements p99", unit="ms"),
                    Row("rollback: CPU of this process p50", metric="client cpu p50", unit="ms"),
                    Row("rollback commit p99", metric="commit p99", unit="ms"),
                    Row(
                        f"statements per rollback of {ROLLBACK_SPAN}",
                        metric="statements short",
                        unit="n",
                    ),
                    Row(
                        f"statements per rollback of {LONG_SPAN}",
                        metric="statements long",
                        unit="n",
                    ),
                    Row("load average (1 min), rollbacks", metric="load average", unit="n"),
                ),
            ),
        ]

    def _reads(self, engine: Engine) -> dict[str, float]:
        """Both reads in the same rounds, their order alternating (ABBA), so that a stall of the
        machine falls on both alike rather than on whichever ran while it lasted."""
        queries = (("latest", False), ("latest?health=good", True))
        took: dict[str, list[float]] = {label: [] for label, _ in queries}
        with Session(engine) as s:
            for _ in range(WARM_UP):
                for _, good in queries:
                    latest_restorable(s, JOB, [LUSTRE], good=good)
            for i in range(self.reads):
                for label, good in queries if i % 2 == 0 else queries[::-1]:
                    t0 = time.perf_counter()
                    latest_restorable(s, JOB, [LUSTRE], good=good)
                    took[label].append((time.perf_counter() - t0) * 1000)
        out = {"load average": os.getloadavg()[0]}
        for label, ms in took.items():
            out[f"{label} p50"] = percentile(ms, 0.5)
            out[f"{label} p99"] = percentile(ms, 0.99)
        return out

    def _rollbacks(self, engine: Engine, job_id: int) -> dict[str, float]:
        """Rollbacks, each after ROLLBACK_SPAN untimed saves, timed in two parts: its
        statements, and its commit (the WAL flush: the disk's, not the code's). Then the
        statements a rollback runs over ROLLBACK_SPAN and over LONG_SPAN checkpoints."""
        total, statements, commits, cpu = [], [], [], []
        with Session(engine) as s:
            for i in range(WARM_UP + self.rollbacks):
                # One more than it supersedes: never back to the step the last one went to
                # (that would be the same rollback again, answered without a new branch).
                head = self._save(s, job_id, ROLLBACK_SPAN + 1)
                c0, t0 = time.process_time(), time.perf_counter()
                rollback(s, JOB, head - ROLLBACK_SPAN, from_branch=None, reason=None, actor="b")
                t1, c1 = time.perf_counter(), time.process_time()
                s.commit()
                t2 = time.perf_counter()
                if i >= WARM_UP:
                    statements.append((t1 - t0) * 1000)
                    commits.append((t2 - t1) * 1000)
                    total.append((t2 - t0) * 1000)
                    cpu.append((c1 - c0) * 1000)
            out = {
                "load average": os.getloadavg()[0],
                "rollback p50": percentile(total, 0.5),
                "rollback p99": percentile(total, 0.99),
                "statements p99": percentile(statements, 0.99),
                "commit p99": percentile(commits, 0.99),
                "statements p50": percentile(statements, 0.5),
                "client cpu p50": percentile(cpu, 0.5),
            }
            for label, span in (("short", ROLLBACK_SPAN), ("long", LONG_SPAN)):
                head = self._save(s, job_id, span + 1)
                with _counting(engine) as ran:
                    done = rollback(s, JOB, head - span, from_branch=None, reason=None, actor="b")
                s.commit()
                assert done.created and len(done.superseded) == span, done
                out[f"statements {label}"] = float(sum(ran))
        return out

    @staticmethod
    def _save(s: Session, job_id: int, n: int) -> int:
        """`n` new restorable checkpoints on the current branch, committed; the newest step."""
        s.execute(text(_SAVE), {"job": job_id, "n": n})
        head: int = s.execute(
            text("SELECT max(step) FROM checkpoint WHERE job_id = :job AND superseded_by IS NULL"),
            {"job": job_id},
        ).scalar_one()
        s.commit()
        return head

    def close(self) -> None:
        if self.pg is not None:
            self.pg.stop()
