"""A run's timeline at scale: `latest?health=good` against plain `latest`, and a rollback.

One job in an embedded Postgres (migrated for real) with `checkpoints` checkpoints over
`branches` branches, filled set-based: each branch holds checkpoints/branches consecutive steps
and starts GO_BACK steps before its parent's newest, whose later checkpoints it supersedes (so
the timeline is the newest branch plus, before each branch point, its ancestors'); one
checkpoint in GOOD_EVERY has a good verdict; every checkpoint has one shard, verified and
restorable on a shared tier. The catalog functions the API calls are timed on one session
(no HTTP: the ratio is the catalog's own, which HTTP would only dilute):

- `latest` and `latest?health=good`: `reads` answers each, p50 and p99, in one run; the ratio of
  their p99 is the target (within 1.2x);
- a rollback: before each, untimed, ROLLBACK_SPAN new checkpoints are saved on the current
  branch; the rollback to the step before them (which supersedes them) and its commit are timed;
  p99 (target: under 50 ms).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres
from benchmarks.harness import Method, Outcome, Row, Scenario
from benchmarks.scenarios.register_latency import percentile
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.timeline.branches import rollback
from tierpoint.tier_config import TierConfig, TierKind

JOB = "timeline-bench"
GO_BACK = 20
GOOD_EVERY = 50
ROLLBACK_SPAN = 5
ROLLBACKS = 100

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
  SELECT j.id AS job_id, j.current_branch AS branch, max(c.step) AS step
  FROM job j JOIN checkpoint c ON c.job_id = j.id AND c.superseded_by IS NULL
  WHERE j.id = :job GROUP BY j.id, j.current_branch
), made AS (
  INSERT INTO checkpoint (job_id, branch, step, total_bytes, shard_count, manifest_digest)
  SELECT head.job_id, head.branch, head.step + k, 100, 1, md5(random()::text)
  FROM head, generate_series(1, :n) k RETURNING id, job_id, step
)
INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state, restorable_at)
SELECT id, 'lustre', job_id, step, 'restorable', now() FROM made
"""
LUSTRE = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")


class Timeline(Scenario):
    name = "timeline"
    summary = "latest?health=good vs latest, and a rollback, on a job of many branches"

    def __init__(self, work: Path, checkpoints: int, branches: int, reads: int) -> None:
        self.work, self.checkpoints, self.branches, self.reads = work, checkpoints, branches, reads
        self.pg: EmbeddedPostgres | None = None
        self.fill_seconds = 0.0

    def params(self) -> dict[str, Any]:
        return {
            "checkpoints": self.checkpoints,
            "branches": self.branches,
            "good_every": GOOD_EVERY,
            "reads_per_run": self.reads,
            "rollbacks_per_run": ROLLBACKS,
            "fill_seconds": round(self.fill_seconds, 1),
        }

    def _fill(self, libpq: str) -> int:
        t0 = time.perf_counter()
        per = self.checkpoints // self.branches
        with psycopg.connect(libpq, autocommit=True) as conn:
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
            for sql in (_FILL, _SHARDS, _COPIES, _REPLICAS, _BRANCHES):
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
            out: dict[str, float] = {}
            with Session(engine) as s:
                for label, good in (("latest", False), ("latest?health=good", True)):
                    latest_restorable(s, JOB, [LUSTRE], good=good)  # warm
                    took = []
                    for _ in range(self.reads):
                        t0 = time.perf_counter()
                        latest_restorable(s, JOB, [LUSTRE], good=good)
                        took.append((time.perf_counter() - t0) * 1000)
                    out[f"{label} p50"] = percentile(took, 0.5)
                    out[f"{label} p99"] = percentile(took, 0.99)
            return Outcome(out)

        def rollbacks() -> Outcome:
            took = []
            with Session(engine) as s:
                for _ in range(ROLLBACKS):
                    s.execute(text(_SAVE), {"job": job_id, "n": ROLLBACK_SPAN})
                    head = s.execute(
                        text(
                            "SELECT max(step) FROM checkpoint WHERE job_id = :job "
                            "AND superseded_by IS NULL"
                        ),
                        {"job": job_id},
                    ).scalar_one()
                    s.commit()
                    t0 = time.perf_counter()
                    rollback(s, JOB, head - ROLLBACK_SPAN, from_branch=None, reason=None, actor="b")
                    s.commit()
                    took.append((time.perf_counter() - t0) * 1000)
            return Outcome(
                {"rollback p50": percentile(took, 0.5), "rollback p99": percentile(took, 0.99)}
            )

        return [
            Method(
                "latest, latest?health=good",
                reads,
                (
                    Row("latest p50", metric="latest p50", unit="ms"),
                    Row("latest p99", metric="latest p99", unit="ms"),
                    Row("latest?health=good p50", metric="latest?health=good p50", unit="ms"),
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
                ),
            ),
        ]

    def close(self) -> None:
        if self.pg is not None:
            self.pg.stop()
