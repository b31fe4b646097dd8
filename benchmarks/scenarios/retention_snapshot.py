"""The snapshot a retention pass plans on, for a job with a long history: most of its copies
expired, a few kept. A pass is requested after every promotion, so this is paid up to once per
tier per checkpoint, for the job's whole life.

One job in an embedded Postgres (migrated for real, filled set-based by
benchmarks/catalog_fill.py), then every copy older than the newest few expired on each tier
(markers and replicas), as retention leaves them. The whole of `take_snapshot` (which counts the
replicas of copies that are not expired) is compared with the one query it replaced alone: the
count over every replica of the job, which the snapshot ran before. So the ratio is an upper bound
of new / old: the old snapshot cost at least that query.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres
from benchmarks.catalog_fill import TIERS, Catalog, fill, job_name
from benchmarks.harness import Method, Outcome, Row, Scenario
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Checkpoint, Job, Replica, Shard
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.retention.policy import TierRef
from tierpoint.states import ReplicaState
from tierpoint.tier_config import TierKind

REFS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
# Copies kept per tier, newest first: what a typical policy leaves (a few local, more durable).
KEPT = {"ssd": 2, "lustre": 5, "s3": 50}
READS = 5  # snapshots per run

_EXPIRE = """
WITH ranked AS (
  SELECT id, rank() OVER (ORDER BY step DESC) AS r FROM checkpoint
)
UPDATE {table} t SET state = %(state)s
FROM ranked WHERE ranked.id = t.checkpoint_id AND t.tier = %(tier)s AND ranked.r > %(kept)s
"""


def every_replica_totals(session: Session, job: str) -> int:
    """The replica count of the snapshot before it skipped expired copies: every replica of the
    job on the tiers, grouped per checkpoint and tier (the baseline)."""
    stored = case((Replica.state == ReplicaState.VERIFIED.value, Shard.size), else_=0)
    rows = session.execute(
        select(
            Replica.checkpoint_id,
            Replica.tier,
            func.count().filter(Replica.state == ReplicaState.VERIFIED.value),
            func.coalesce(func.sum(stored), 0),
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .join(Checkpoint, Checkpoint.id == Replica.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.name == job, Replica.tier.in_(TIERS))
        .group_by(Replica.checkpoint_id, Replica.tier)
    ).all()
    return len(rows)


class RetentionSnapshot(Scenario):
    name = "retention_snapshot"
    summary = "retention's snapshot of a job with a long, mostly expired history"

    def __init__(self, work: Path, checkpoints: int, shards: int) -> None:
        self.work = work
        self.catalog = Catalog(1, checkpoints, shards)
        self.pg: EmbeddedPostgres | None = None
        self.url = ""
        self.fill_seconds: dict[str, float] = {}

    def params(self) -> dict[str, Any]:
        return {
            "checkpoints": self.catalog.checkpoints,
            "shards_per_checkpoint": self.catalog.shards_per_checkpoint,
            "replicas": self.catalog.shards * len(TIERS),
            "kept_per_tier": KEPT,
            "snapshots_per_run": READS,
            "fill_seconds": self.fill_seconds,
        }

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        self.url = self.pg.start()
        migrate.upgrade(self.url)
        libpq = self.url.replace("postgresql+psycopg://", "postgresql://", 1)
        self.fill_seconds = fill(libpq, self.catalog)
        with psycopg.connect(libpq, autocommit=True) as conn:
            for tier, kept in KEPT.items():
                for table, state in (("checkpoint_tier", "expired"), ("replica", "expired")):
                    conn.execute(
                        _EXPIRE.format(table=table), {"state": state, "tier": tier, "kept": kept}
                    )
            conn.execute("VACUUM (ANALYZE)")
        engine = make_sync_engine(self.url)
        job = job_name(1)
        now = datetime.now(UTC)

        def timed(read: Any) -> Any:
            def run() -> Outcome:
                with Session(engine) as s:
                    read(s)  # warm: plans and the pages the reads touch
                    t0 = time.perf_counter()
                    for _ in range(READS):
                        read(s)
                    return Outcome({"seconds": (time.perf_counter() - t0) / READS})

            return run

        baseline = "before: the count over every replica of the job, alone"
        return [
            Method(baseline, timed(lambda s: every_replica_totals(s, job)), (Row(baseline),)),
            Method(
                "take_snapshot (replicas of copies not expired)",
                timed(lambda s: take_snapshot(s, job, REFS, now)),
                (Row("take_snapshot (replicas of copies not expired)", baseline=baseline),),
            ),
        ]

    def close(self) -> None:
        if self.pg is not None:
            self.pg.stop()
