"""The copy activities' replica writes: what a batch's reporter sends the catalog as its shards
are copied and verified (it flushes on a timer what its interval saw; here FLUSH at a time).

One checkpoint in an embedded Postgres (migrated for real). Each run writes a replica per shard
on one tier twice, as a copy does: `copying` (inserts), then `verified` (updates), committed at
the end; the tier's replicas are deleted before each run, untimed. `upsert_replicas` (one
statement built once, the rows as its parameters) is compared with the statement it replaced: the
same upsert with the rows in a VALUES list built, and so compiled, on every call.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import and_, case, delete, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from apps.devstack.services import EmbeddedPostgres
from benchmarks.harness import Method, Outcome, Row, Scenario
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica import machine as replicas
from tierpoint.catalog.replica.machine import ReplicaWrite
from tierpoint.states import ReplicaState

FLUSH = 500  # replicas per flush
TIER = "lustre"
NODE = "node-0"
# The old statement's own guard, as it was then.
_ON_LOST_NODE = Replica.node_id.in_(select(Node.id).where(Node.lost_at.is_not(None)))

Write = Callable[[Session, int, list[ReplicaWrite]], None]


def values_list_per_call(session: Session, checkpoint_id: int, writes: list[ReplicaWrite]) -> None:
    """The upsert before (the baseline): its rows in a VALUES list, a new statement per call."""
    stmt = pg_insert(Replica).values(
        [
            {
                "shard_id": w.shard_id,
                "checkpoint_id": checkpoint_id,
                "tier": TIER,
                "node_id": w.node_id,
                "state": w.state.value,
                "location": w.location,
                "bytes_done": w.bytes_done,
                "error": w.error,
                "verified_at": func.now() if w.state is ReplicaState.VERIFIED else None,
            }
            for w in writes
        ]
    )
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["shard_id", "tier"],
            set_={
                "state": stmt.excluded.state,
                "location": stmt.excluded.location,
                "node_id": stmt.excluded.node_id,
                "bytes_done": case(
                    (stmt.excluded.state == ReplicaState.COPYING.value, Replica.bytes_done),
                    else_=stmt.excluded.bytes_done,
                ),
                "error": stmt.excluded.error,
                "verified_at": stmt.excluded.verified_at,
                "updated_at": func.now(),
            },
            where=and_(
                Replica.state.notin_([ReplicaState.VERIFIED.value, ReplicaState.EXPIRING.value]),
                ~and_(Replica.state == ReplicaState.LOST.value, _ON_LOST_NODE),
            ),
        )
    )


def upsert_replicas(session: Session, checkpoint_id: int, writes: list[ReplicaWrite]) -> None:
    replicas.upsert_replicas(session, checkpoint_id, TIER, writes)


class ReplicaWrites(Scenario):
    name = "replica_writes"
    summary = "the copy activities' replica writes: copying then verified, in flushes"

    def __init__(self, work: Path, sizes: Sequence[int]) -> None:
        self.work, self.sizes = work, list(sizes)
        self.pg: EmbeddedPostgres | None = None

    def params(self) -> dict[str, Any]:
        return {"replicas": self.sizes, "flush": FLUSH, "writes_per_replica": 2}

    def _checkpoint(self, session: Session, shards: int) -> tuple[int, list[int]]:
        job = session.scalar(
            insert(Job).values(name=f"bench-{uuid.uuid4().hex[:10]}").returning(Job.id)
        )
        cp = session.scalar(
            insert(Checkpoint)
            .values(job_id=job, step=1, total_bytes=shards, shard_count=shards, manifest_digest="d")
            .returning(Checkpoint.id)
        )
        assert cp is not None
        session.execute(
            insert(Shard),
            [
                {
                    "checkpoint_id": cp,
                    "ordinal": i,
                    "path": f"rank-{i}.distcp",
                    "size": 1,
                    "checksum": "00000000",
                    "node_id": NODE,
                }
                for i in range(shards)
            ],
        )
        ids = session.scalars(
            select(Shard.id).where(Shard.checkpoint_id == cp).order_by(Shard.ordinal)
        )
        return cp, list(ids)

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        url = self.pg.start()
        migrate.upgrade(url)
        engine = make_sync_engine(url)
        with Session(engine) as s:
            upsert_node(s, NODE, {})
            s.commit()

        methods: list[Method] = []
        for n in self.sizes:
            with Session(engine) as s:
                cp, shards = self._checkpoint(s, n)
                s.commit()

            def clear(cp: int = cp) -> None:
                with Session(engine) as s:
                    s.execute(delete(Replica).where(Replica.checkpoint_id == cp))
                    s.commit()

            def timed(
                write: Write, cp: int = cp, shards: list[int] = shards
            ) -> Callable[[], Outcome]:
                def run() -> Outcome:
                    with Session(engine) as s:
                        t0 = time.perf_counter()
                        for state, done in ((ReplicaState.COPYING, 0), (ReplicaState.VERIFIED, 1)):
                            writes = [
                                ReplicaWrite(sid, state, f"/lustre/{sid}", NODE, done)
                                for sid in shards
                            ]
                            for i in range(0, len(writes), FLUSH):
                                write(s, cp, writes[i : i + FLUSH])
                        s.commit()
                        return Outcome({"seconds": time.perf_counter() - t0})

                return run

            baseline = f"{n:,} replicas: before, a VALUES list per call"
            ours = f"{n:,} replicas: upsert_replicas"
            methods += [
                Method(baseline, timed(values_list_per_call), (Row(baseline),), before=clear),
                Method(ours, timed(upsert_replicas), (Row(ours, baseline=baseline),), before=clear),
            ]
        return methods

    def close(self) -> None:
        if self.pg is not None:
            self.pg.stop()
