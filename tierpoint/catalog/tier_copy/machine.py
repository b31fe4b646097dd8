"""A tier copy's state machine: a checkpoint's copy on one tier as a whole (`models.TierCopy`, the
table `checkpoint_tier`), and the one module that changes its state.

`TRANSITIONS` is the statement of every move: the states it leaves from, the state it goes to and
why. Every write of the state is a move of it, here: its UPDATE or DELETE changes only rows in the
move's source states, so a move the table does not list cannot happen, and a row that moved
meanwhile (a repair, an expiry) is left as it is. A writer first locks what it moves through
`locks.lock_in_order` (nodes, checkpoints, tier copies, replicas: one order for every writer) and
moves only tier copies it holds. New rows are `pending`. A tier copy also goes with its
checkpoint's row, when a deleted step is registered again (`checkpoint/registration.py`, once no
copy of it is `expiring`).

The states themselves are `tierpoint.states.TierState`; the table of moves in
docs/architecture.md is `describe()`'s, checked by a test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import CheckpointHead
from tierpoint.catalog.locks import Locked, lock_in_order
from tierpoint.catalog.models import Replica, TierCopy
from tierpoint.states import TierState

PENDING, RESTORABLE, FAILED = TierState.PENDING, TierState.RESTORABLE, TierState.FAILED
EXPIRING, EXPIRED = TierState.EXPIRING, TierState.EXPIRED


class Move(StrEnum):
    REGISTERED = "registered"
    PLANNED = "planned"
    SKIPPED = "skipped"
    PROMOTED = "promoted"
    PROMOTION_FAILED = "promotion failed"
    SOURCE_FAILED = "source failed"
    DAMAGED = "damaged"
    NODE_LOST = "node lost"
    HOLDER_LOST = "holder lost"
    EXPIRY_BEGUN = "expiry begun"
    DELETED = "deleted"
    EXPIRED = "expired"
    RETRIED = "retried"


@dataclass(frozen=True)
class Transition:
    # None: no row (a new tier copy comes from none; a skipped one goes to none)
    sources: frozenset[TierState | None]
    target: TierState | None
    why: str


def _t(sources: Iterable[TierState | None], target: TierState | None, why: str) -> Transition:
    return Transition(frozenset(sources), target, why)


TRANSITIONS: Mapping[Move, Transition] = {
    Move.REGISTERED: _t(
        [None], PENDING, "registration: a tier copy to make on every configured tier"
    ),
    Move.PLANNED: _t(
        [None],
        PENDING,
        "the lifecycle's plan: one on each tier the policy sends the step to (others stay as they "
        "are)",
    ),
    Move.SKIPPED: _t(
        [PENDING],
        None,
        "the policy does not send this step to the tier (promote_every) and no copy began there",
    ),
    Move.PROMOTED: _t(
        [PENDING, FAILED],
        RESTORABLE,
        "promotion: every shard verified on the tier, on a node not lost (from failed: repair or "
        "a retry made it whole again)",
    ),
    Move.PROMOTION_FAILED: _t(
        [PENDING, FAILED],
        FAILED,
        "promotion: a shard without a verified replica there, or the stage gave up",
    ),
    Move.SOURCE_FAILED: _t([PENDING], FAILED, "the tier it would be copied from failed"),
    Move.DAMAGED: _t(
        [RESTORABLE],
        FAILED,
        "a replica found bad: a scrub, a reconciliation, a reader's report, a copy reading its "
        "source",
    ),
    Move.NODE_LOST: _t(
        [PENDING, RESTORABLE], FAILED, "a node that holds shards of it was declared lost"
    ),
    Move.HOLDER_LOST: _t(
        [PENDING, RESTORABLE], FAILED, "the node holding its peer copy was declared lost"
    ),
    Move.EXPIRY_BEGUN: _t(
        [RESTORABLE, FAILED],
        EXPIRING,
        "retention begins deleting it, committed before any byte goes (from failed: a local or "
        "peer copy a lost node took part of)",
    ),
    Move.DELETED: _t([RESTORABLE, PENDING, FAILED], EXPIRING, "an admin deleted the checkpoint"),
    Move.EXPIRED: _t([EXPIRING], EXPIRED, "retention deleted its bytes"),
    Move.RETRIED: _t([FAILED], PENDING, "an operator's retry: a new lifecycle run makes it"),
}


def sources(move: Move) -> list[str]:
    """The stored states a move leaves from."""
    return sorted(s.value for s in TRANSITIONS[move].sources if s is not None)


def _target(move: Move) -> str:
    target = TRANSITIONS[move].target
    assert target is not None
    return target.value


# Registration inserts its tier copies in the statement that inserts its shards (one round trip
# for the job's hot path): this is its second half, a REGISTERED move for each of `:tiers`.
REGISTER_TIER_COPIES_SQL = (
    "INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state) "
    "SELECT :cid, t.tier, :job_id, :step, :state "
    "FROM unnest(CAST(:tiers AS text[])) AS t(tier)"
)
REGISTERED_STATE = _target(Move.REGISTERED)


def ensure_tier_copies(session: Session, head: CheckpointHead, tiers: Sequence[str]) -> None:
    """A `pending` tier copy on each of `tiers` that has none (PLANNED); existing ones keep their
    state."""
    if not tiers:
        return
    stmt = insert(TierCopy).values(
        [
            {
                "checkpoint_id": head.id,
                "tier": t,
                "job_id": head.job_id,
                "step": head.step,
                "state": _target(Move.PLANNED),
            }
            for t in tiers
        ]
    )
    session.execute(stmt.on_conflict_do_nothing(index_elements=["checkpoint_id", "tier"]))


def drop_skipped_tier_copies(
    session: Session, head: CheckpointHead, skipped: Sequence[str]
) -> None:
    """Tiers the retention policy does not send this checkpoint to (promote_every) get no tier
    copy: remove the `pending` ones registration made, unless a copy was started there (SKIPPED).
    """
    if not skipped:
        return
    locked = lock_in_order(session, tier_copies=[(head.id, t) for t in skipped])
    if not locked.tier_copies:
        return
    session.execute(
        delete(TierCopy).where(
            _held(locked, locked.tier_copies),
            TierCopy.state.in_(sources(Move.SKIPPED)),
            ~exists().where(Replica.checkpoint_id == head.id, Replica.tier == TierCopy.tier),
        )
    )


class _Keep:
    """The reason a move leaves as it is."""


KEEP = _Keep()


def move(
    session: Session,
    locked: Locked,
    how: Move,
    copies: Iterable[tuple[int, str]],
    *,
    reason: str | _Keep | None = KEEP,
    **values: Any,
) -> list[tuple[int, str]]:
    """Move the tier copies `copies` (each held in `locked`) that are in one of `how`'s source
    states to its target, with `reason` (unless KEEP) and `values` (other columns of the row);
    returns the (checkpoint id, tier) of those that moved."""
    wanted = sorted(set(copies))
    if not wanted:
        return []
    changes: dict[str, Any] = {"state": _target(how), "updated_at": func.now(), **values}
    if not isinstance(reason, _Keep):
        changes["reason"] = reason
    rows = session.execute(
        update(TierCopy)
        .where(_held(locked, wanted), TierCopy.state.in_(sources(how)))
        .values(changes)
        .returning(TierCopy.checkpoint_id, TierCopy.tier)
    ).all()
    return [(cid, tier) for cid, tier in rows]


def _held(locked: Locked, copies: Iterable[tuple[int, str]]) -> ColumnElement[bool]:
    keys = sorted(copies)
    unheld = [k for k in keys if k not in locked.tier_copies]
    if unheld:
        raise AssertionError(f"tier copies moved without their lock: {unheld[:3]}")
    return tuple_(TierCopy.checkpoint_id, TierCopy.tier).in_(keys)


def describe() -> list[tuple[str, str, str, str]]:
    """The transition table as the docs show it: (move, from, to, why) per move."""
    order = list(TierState)

    def name(state: TierState | None) -> str:
        return "(none)" if state is None else f"`{state.value}`"

    def rank(state: TierState | None) -> int:
        return -1 if state is None else order.index(state)

    return [
        (m.value, " or ".join(name(x) for x in sorted(t.sources, key=rank)), name(t.target), t.why)
        for m, t in TRANSITIONS.items()
    ]
