"""Replicas: one shard's copy on one tier (and node, for a tier on the nodes).

Every write is idempotent: replicas are upserted on (shard, tier), state changes are conditional,
and a verified replica is never downgraded by a copy that runs again."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import cast

from sqlalchemy import (
    Table,
    bindparam,
    func,
    text,
    update,
)
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Replica
from tierpoint.catalog.node.registry import lost_among, lost_reason
from tierpoint.states import ReplicaState

# see upsert_replicas
# guard: expired-replica-overwritten
_KEPT = (ReplicaState.VERIFIED, ReplicaState.EXPIRING, ReplicaState.EXPIRED)
_NOT_OVERWRITTEN = [s.value for s in _KEPT]
_replica_table = cast(Table, Replica.__table__)


@dataclass(frozen=True)
class ReplicaWrite:
    shard_id: int
    state: ReplicaState
    location: str
    node_id: str | None = None
    bytes_done: int = 0
    error: str | None = None
    # Which file was read there (the read's `VerifyResult.identity`); None: none read.
    identity: str | None = None


# One statement per call whatever the number of rows: the rows travel as one JSON document that
# Postgres unpacks (as registration's shards do). Run through executemany, the same upsert was
# one execution per row (psycopg's executemany does not merge rows into a VALUES list), each with
# its own executor start and trigger calls: the largest share of the catalog's time in a
# checkpoint's lifecycle. A verified, expiring or expired replica is not overwritten (see
# upsert_replicas); a copy that starts again keeps showing the progress it had.
_UPSERT_REPLICAS = text(
    "INSERT INTO replica AS r "
    "(shard_id, checkpoint_id, tier, node_id, state, location, bytes_done, verified_at, error, "
    "file_identity) "
    "SELECT x.shard_id, :cid, :tier, x.node_id, x.state, x.location, x.bytes_done, "
    "CASE WHEN x.verified THEN now() END, x.error, x.identity "
    "FROM ROWS FROM (json_to_recordset(CAST(:rows AS json)) AS (shard_id bigint, node_id text, "
    "state text, location text, bytes_done bigint, error text, verified boolean, identity text)) "
    "WITH ORDINALITY AS x(shard_id, node_id, state, location, bytes_done, error, verified, "
    "identity, o) "
    "ORDER BY x.o "
    "ON CONFLICT (shard_id, tier) DO UPDATE SET "
    "state = excluded.state, location = excluded.location, node_id = excluded.node_id, "
    "bytes_done = CASE WHEN excluded.state = :copying THEN r.bytes_done "
    "ELSE excluded.bytes_done END, "
    "error = excluded.error, verified_at = excluded.verified_at, "
    "file_identity = excluded.file_identity, updated_at = now() "
    "WHERE r.state NOT IN (:kept_1, :kept_2, :kept_3)"
)


def _distinct_runs(writes: list[ReplicaWrite]) -> list[list[ReplicaWrite]]:
    """The writes cut, in order, into runs in which no shard appears twice: one statement may not
    touch a row twice, and runs in order leave every row as writing them one by one would."""
    runs: list[list[ReplicaWrite]] = [[]]
    seen: set[int] = set()
    for w in writes:
        if w.shard_id in seen:
            runs.append([])
            seen.clear()
        runs[-1].append(w)
        seen.add(w.shard_id)
    return [r for r in runs if r]


def upsert_replicas(
    session: Session, checkpoint_id: int, tier: str, writes: Iterable[ReplicaWrite]
) -> None:
    """Insert or update replicas of one tier. A verified replica only changes through
    `damage.mark_damaged` (a later read proved it bad), one being expired or expired is left to
    retention (a reseal that finds its file gone must not call it corrupt).

    Every write for a node declared lost is written lost, whether the row exists (a worker still
    running there cannot bring it back) or not (the declaration marks only the rows that exist,
    and a seal that began before it inserts its rows after). One lost elsewhere (an S3 object
    deleted behind tierpoint's back) is what repair copies again. The share lock of `lost_among`
    orders this write with a declaration in flight: the declaration either committed first and is
    seen here, or waits for this transaction and then marks what it wrote."""
    writes = list(writes)
    lost = set(lost_among(session, (w.node_id for w in writes if w.node_id is not None)))
    writes = [
        replace(w, state=ReplicaState.LOST, error=lost_reason(w.node_id))
        # guard: replica-first-written-lost
        if w.node_id is not None and w.node_id in lost
        else w
        for w in writes
    ]
    kept = {f"kept_{i}": state for i, state in enumerate(_NOT_OVERWRITTEN, 1)}
    for run in _distinct_runs(writes):
        rows = [
            {
                "shard_id": w.shard_id,
                "node_id": w.node_id,
                "state": w.state.value,
                "location": w.location,
                "bytes_done": w.bytes_done,
                "error": w.error,
                "verified": w.state is ReplicaState.VERIFIED,
                "identity": w.identity,
            }
            for w in run
        ]
        params = {"cid": checkpoint_id, "tier": tier, "rows": json.dumps(rows)}
        session.execute(_UPSERT_REPLICAS, params | kept | {"copying": ReplicaState.COPYING.value})


def set_bytes_done(session: Session, tier: str, progress: dict[int, int]) -> None:
    if not progress:
        return
    session.connection().execute(
        update(_replica_table)
        .where(
            _replica_table.c.shard_id == bindparam("sid"),
            _replica_table.c.tier == tier,
            _replica_table.c.state == ReplicaState.COPYING.value,
        )
        .values(bytes_done=bindparam("done"), updated_at=func.now()),
        [{"sid": sid, "done": done} for sid, done in progress.items()],
    )
