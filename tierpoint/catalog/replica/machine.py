"""A replica's state machine: one shard's copy on one tier (and node, for a tier on the nodes),
and the one module that changes its state.

`TRANSITIONS` is the statement of every move: the states it leaves from, the states it may go to
and why. Every write of a replica's state is a move of it, here, and changes only rows in the
move's source states. A seal, copy or repair records what it found with `upsert_replicas`, after
taking the share lock of the nodes it writes for; every other move takes the replicas' tier
copies (and the replicas, or their node) through `locks.lock_in_order` first and moves only what
it holds. Every write is idempotent: replicas are upserted on (shard, tier), and a verified
replica is never downgraded by a copy that runs again.

The states themselves are `tierpoint.states.ReplicaState`; the table of moves in
docs/architecture.md is `describe()`'s, checked by a test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import cast

from sqlalchemy import Table, Text, any_, bindparam, func, text, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from tierpoint.catalog.locks import Locked, RowLock
from tierpoint.catalog.models import Replica
from tierpoint.catalog.node.registry import lost_among, lost_reason
from tierpoint.states import ReplicaState

PENDING, COPYING, VERIFIED = ReplicaState.PENDING, ReplicaState.COPYING, ReplicaState.VERIFIED
CORRUPT, LOST = ReplicaState.CORRUPT, ReplicaState.LOST
EXPIRING, EXPIRED = ReplicaState.EXPIRING, ReplicaState.EXPIRED
# Every state but expired: an expiry moves whatever the tier's copy still has.
NOT_EXPIRED = [PENDING, COPYING, VERIFIED, CORRUPT, LOST, EXPIRING]


class Move(StrEnum):
    RECORDED = "recorded"
    FOUND_BAD = "found bad"
    NODE_LOST = "node lost"
    EXPIRY_BEGUN = "expiry begun"
    DELETED = "deleted"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Transition:
    sources: frozenset[ReplicaState | None]  # None: no row yet
    targets: frozenset[ReplicaState]
    why: str


def _t(
    sources: Iterable[ReplicaState | None], targets: Iterable[ReplicaState], why: str
) -> Transition:
    return Transition(frozenset(sources), frozenset(targets), why)


TRANSITIONS: Mapping[Move, Transition] = {
    Move.RECORDED: _t(
        # guard: expired-replica-overwritten
        [None, PENDING, COPYING, CORRUPT, LOST],
        [PENDING, COPYING, VERIFIED, CORRUPT, LOST],
        "a seal, copy or repair records what it found (lost: its node was declared lost); never "
        "over a verified replica (only a later read proves it bad), nor over one retention is "
        "deleting or deleted",
    ),
    Move.FOUND_BAD: _t(
        [VERIFIED],
        [CORRUPT, LOST],
        "a read proved it bad or gone: a scrub, a reconciliation, a reader's report, a copy "
        "reading its source",
    ),
    Move.NODE_LOST: _t([PENDING, COPYING, VERIFIED, CORRUPT], [LOST], "its node was declared lost"),
    Move.EXPIRY_BEGUN: _t(NOT_EXPIRED, [EXPIRING], "retention begins deleting its tier copy"),
    Move.DELETED: _t(NOT_EXPIRED, [EXPIRING], "an admin deleted the checkpoint"),
    Move.EXPIRED: _t(NOT_EXPIRED, [EXPIRED], "retention deleted its tier copy's bytes"),
}


def sources(move: Move) -> list[str]:
    """The stored states a move leaves from."""
    return sorted(s.value for s in TRANSITIONS[move].sources if s is not None)


def _check(move: Move, to: ReplicaState) -> str:
    if to not in TRANSITIONS[move].targets:
        raise AssertionError(f"a replica's move {move.value} does not go to {to.value}")
    return to.value


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
# checkpoint's lifecycle. Only a replica in a RECORDED move's source states is overwritten
# (see upsert_replicas); a copy that starts again keeps showing the progress it had.
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
    "WHERE r.state = ANY(CAST(:recorded_from AS text[]))"
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
    """Insert or update replicas of one tier (RECORDED). A verified replica only changes through
    `mark_bad` (a later read proved it bad), one being expired or expired is left to retention
    (a reseal that finds its file gone must not call it corrupt).

    Every write for a node declared lost is written lost, whether the row exists (a worker still
    running there cannot bring it back) or not (the declaration marks only the rows that exist,
    and a seal that began before it inserts its rows after). One lost elsewhere (an S3 object
    deleted behind tierpoint's back) is what repair copies again. The share lock of `lost_among`
    orders this write with a declaration in flight: the declaration either committed first and is
    seen here, or waits for this transaction and then marks what it wrote."""
    writes = list(writes)
    lost = set(lost_among(session, (w.node_id for w in writes if w.node_id is not None)))
    writes = [
        replace(w, state=LOST, error=lost_reason(w.node_id))
        # guard: replica-first-written-lost
        if w.node_id is not None and w.node_id in lost
        else w
        for w in writes
    ]
    recorded_from = sources(Move.RECORDED)
    for run in _distinct_runs(writes):
        rows = [
            {
                "shard_id": w.shard_id,
                "node_id": w.node_id,
                "state": _check(Move.RECORDED, w.state),
                "location": w.location,
                "bytes_done": w.bytes_done,
                "error": w.error,
                "verified": w.state is VERIFIED,
                "identity": w.identity,
            }
            for w in run
        ]
        params = {"cid": checkpoint_id, "tier": tier, "rows": json.dumps(rows)}
        params |= {"recorded_from": recorded_from, "copying": COPYING.value}
        session.execute(_UPSERT_REPLICAS, params)


def mark_bad(
    session: Session, locked: Locked, errors: Mapping[int, str], state: ReplicaState
) -> None:
    """The replicas `errors` names (id -> why; each held in `locked`) that are still verified
    become `state`, corrupt or lost (FOUND_BAD). Their last good read was of bytes that are gone
    now: the next copy starts afresh."""
    to = _check(Move.FOUND_BAD, state)
    froms = sources(Move.FOUND_BAD)
    ids = sorted(errors)
    if not ids:
        return
    unheld = [i for i in ids if i not in locked.replicas]
    if unheld:
        raise AssertionError(f"replicas moved without their lock: {unheld[:3]}")
    session.connection().execute(
        update(_replica_table)
        .where(
            _replica_table.c.id == bindparam("rid"),
            # the move's source states, as one array (an IN list does not run per row)
            _replica_table.c.state == any_(bindparam("froms", type_=ARRAY(Text))),
        )
        .values(state=to, error=bindparam("err"), scrubbed_at=None, updated_at=func.now()),
        [{"rid": rid, "err": errors[rid][:2000], "froms": froms} for rid in ids],
    )


def lose_on_node(session: Session, locked: Locked, node: str, reason: str) -> list[tuple[int, str]]:
    """Every replica on `node` (whose row `locked` holds for update: it is being declared lost)
    that retention is not deleting and that is not lost yet becomes `lost` (NODE_LOST): the
    node's own local copies and the peer copies it held for other nodes. Returns the
    (checkpoint id, tier) of each."""
    if locked.node_lock is not RowLock.UPDATE or node not in locked.nodes:
        raise AssertionError(f"replicas of node {node} moved without its lock")
    rows = session.execute(
        update(Replica)
        .where(Replica.node_id == node, Replica.state.in_(sources(Move.NODE_LOST)))
        .values(state=_check(Move.NODE_LOST, LOST), error=reason, updated_at=func.now())
        .returning(Replica.checkpoint_id, Replica.tier)
    ).all()
    return [(cp, tier) for cp, tier in rows]


def expire(session: Session, locked: Locked, how: Move, copies: Iterable[tuple[int, str]]) -> None:
    """Every replica of the tier copies `copies` (each held in `locked`) that is not expired yet
    moves with its tier copy: to `expiring` (EXPIRY_BEGUN, DELETED) or `expired` (EXPIRED)."""
    wanted = sorted(set(copies))
    if not wanted:
        return
    unheld = [k for k in wanted if k not in locked.tier_copies]
    if unheld:
        raise AssertionError(f"replicas of tier copies moved without their lock: {unheld[:3]}")
    (to,) = TRANSITIONS[how].targets
    assert how in (Move.EXPIRY_BEGUN, Move.DELETED, Move.EXPIRED)
    session.execute(
        update(Replica)
        .where(
            tuple_(Replica.checkpoint_id, Replica.tier).in_(wanted),
            Replica.state.in_(sources(how)),
        )
        .values(state=to.value, updated_at=func.now())
    )


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


def describe() -> list[tuple[str, str, str, str]]:
    """The transition table as the docs show it: (move, from, to, why) per move."""
    order = list(ReplicaState)
    return [
        (
            m.value,
            _states(t.sources, order),
            _states(t.targets, order),
            t.why,
        )
        for m, t in TRANSITIONS.items()
    ]


def _states(states: Iterable[ReplicaState | None], order: list[ReplicaState]) -> str:
    ranked = sorted(states, key=lambda s: -1 if s is None else order.index(s))
    return " or ".join("(none)" if s is None else f"`{s.value}`" for s in ranked)
