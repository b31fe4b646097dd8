"""A stripe's state machine, and the one module that changes a stripe's state.

A stripe is one of the k+m pieces of one shard's file on a coded peer tier (the Stripe table).
It takes the replica's states; `TRANSITIONS` states every move, and every write here changes only
rows in the move's source states. The encoder places a stripe with the size and crc32c it
computed; the holder's read-back from its own device verifies it only when both match, so a
stripe is verified only if the bytes on its holder are the bytes the encoder cut. Every write is
idempotent: a placement inserts once per (shard, tier, index), a read-back run twice finds the
stripe already moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, case, exists, func, or_, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, aliased

from tierpoint.catalog.models import Stripe
from tierpoint.states import ReplicaState

PENDING, COPYING, VERIFIED = ReplicaState.PENDING, ReplicaState.COPYING, ReplicaState.VERIFIED
CORRUPT, LOST = ReplicaState.CORRUPT, ReplicaState.LOST
EXPIRING, EXPIRED = ReplicaState.EXPIRING, ReplicaState.EXPIRED
NOT_EXPIRED = [PENDING, COPYING, VERIFIED, CORRUPT, LOST, EXPIRING]


class Move(StrEnum):
    PLACED = "placed"
    READ_BACK = "read back"
    FOUND_BAD = "found bad"
    NODE_LOST = "node lost"
    RE_PLACED = "re-placed"
    EXPIRY_BEGUN = "expiry begun"
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
    Move.PLACED: _t(
        [None], [PENDING], "the shard's node cut its file and chose the stripe's holder"
    ),
    Move.READ_BACK: _t(
        [PENDING, COPYING, CORRUPT],
        [VERIFIED, CORRUPT],
        "the holder read its stripe back from its device: verified when its size and crc32c "
        "are the encoder's, corrupt otherwise",
    ),
    Move.FOUND_BAD: _t(
        [VERIFIED], [CORRUPT, LOST], "a read proved it bad or gone: a scrub, a restore's check"
    ),
    Move.NODE_LOST: _t(
        [PENDING, COPYING, VERIFIED, CORRUPT], [LOST], "its holder was declared lost"
    ),
    Move.RE_PLACED: _t(
        [LOST, CORRUPT],
        [PENDING],
        "a rebuild gave it a new holder, which holds no other stripe of its set, to cut it "
        "again from k others",
    ),
    Move.EXPIRY_BEGUN: _t(NOT_EXPIRED, [EXPIRING], "retention begins deleting its tier copy"),
    Move.EXPIRED: _t(NOT_EXPIRED, [EXPIRED], "retention deleted its tier copy's stripes"),
}


def _sources(move: Move) -> list[str]:
    return sorted(s.value for s in TRANSITIONS[move].sources if s is not None)


# The states a stripe leaves when its holder is declared lost.
NODE_LOST_SOURCES = _sources(Move.NODE_LOST)


@dataclass(frozen=True)
class PlacedStripe:
    shard_id: int
    index: int
    node: str
    size: int
    crc32c: str


def place(
    session: Session, checkpoint_id: int, tier: str, code: str, stripes: Sequence[PlacedStripe]
) -> None:
    """Record each stripe as placed (pending) on its holder; a stripe already recorded is kept as
    it is, so a placement run twice changes nothing."""
    if not stripes:
        return
    rows = [
        {
            "shard_id": s.shard_id,
            "checkpoint_id": checkpoint_id,
            "tier": tier,
            "stripe_index": s.index,
            "code": code,
            "node_id": s.node,
            "size": s.size,
            "crc32c": s.crc32c,
            "state": PENDING.value,
        }
        for s in stripes
    ]
    session.execute(
        insert(Stripe)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["shard_id", "tier", "stripe_index"])
    )


@dataclass(frozen=True)
class ReadBack:
    """What a holder read back from its device for one stripe."""

    shard_id: int
    index: int
    size: int
    crc32c: str


def read_back(session: Session, tier: str, results: Sequence[ReadBack]) -> dict[str, int]:
    """Move each stripe by its holder's read-back: verified when size and crc32c are the ones
    placed, corrupt otherwise. The count of stripes moved to each state."""
    moved: dict[str, int] = {}
    for r in results:
        # guard: stripe-verified-only-when-it-matches
        matches = and_(Stripe.size == r.size, Stripe.crc32c == r.crc32c)
        state = session.scalar(
            update(Stripe)
            .where(
                Stripe.shard_id == r.shard_id,
                Stripe.tier == tier,
                Stripe.stripe_index == r.index,
                Stripe.state.in_(_sources(Move.READ_BACK)),
            )
            .values(
                state=case((matches, VERIFIED.value), else_=CORRUPT.value),
                verified_at=case((matches, func.now()), else_=None),
                error=case(
                    (matches, None),
                    else_=f"read back {r.size} bytes, crc32c {r.crc32c}",
                ),
                updated_at=func.now(),
            )
            .returning(Stripe.state)
        )
        if state is not None:
            moved[state] = moved.get(state, 0) + 1
    return moved


def mark_bad(
    session: Session,
    tier: str,
    stripes: Iterable[tuple[int, int]],
    state: ReplicaState,
    reason: str,
) -> int:
    """Verified stripes (shard id, index) a read proved corrupt or gone; how many moved."""
    if state not in TRANSITIONS[Move.FOUND_BAD].targets:
        raise ValueError(f"a stripe found bad is corrupt or lost, not {state}")
    keys = list(stripes)
    if not keys:
        return 0
    result = session.execute(
        update(Stripe)
        .where(
            Stripe.tier == tier,
            tuple_(Stripe.shard_id, Stripe.stripe_index).in_(keys),
            Stripe.state.in_(_sources(Move.FOUND_BAD)),
        )
        .values(state=state.value, error=reason, updated_at=func.now())
    )
    return int(getattr(result, "rowcount", 0) or 0)


def lose_on_node(session: Session, node: str, reason: str) -> int:
    """Every stripe its declared-lost holder had; how many moved."""
    result = session.execute(
        update(Stripe)
        .where(Stripe.node_id == node, Stripe.state.in_(_sources(Move.NODE_LOST)))
        .values(state=LOST.value, error=reason, updated_at=func.now())
    )
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True)
class NewHolder:
    shard_id: int
    index: int
    node: str


def re_place(session: Session, tier: str, moves: Sequence[NewHolder]) -> int:
    """Move each lost or corrupt stripe to its new holder, pending its rebuild there; how many
    moved. A stripe in another state (verified, pending elsewhere: a rebuild placed it already)
    stays, and so does one whose new holder holds another stripe of its set: two stripes of a
    set on one node would both go with that node, and would lie under one name there."""
    moved = 0
    for m in moves:
        other = aliased(Stripe)
        beside = exists().where(
            other.shard_id == m.shard_id,
            other.tier == tier,
            # guard: stripe-never-re-placed-beside-its-set
            other.node_id == m.node,
            other.stripe_index != m.index,
        )
        result = session.execute(
            update(Stripe)
            .where(
                Stripe.shard_id == m.shard_id,
                Stripe.tier == tier,
                Stripe.stripe_index == m.index,
                Stripe.state.in_(_sources(Move.RE_PLACED)),
                ~beside,
            )
            .values(
                node_id=m.node,
                state=PENDING.value,
                verified_at=None,
                error=None,
                updated_at=func.now(),
            )
        )
        moved += int(getattr(result, "rowcount", 0) or 0)
    return moved


def expire(session: Session, how: Move, copies: Iterable[tuple[int, str]]) -> int:
    """Move the stripes of these (checkpoint id, tier) copies: EXPIRY_BEGUN or EXPIRED."""
    if how not in (Move.EXPIRY_BEGUN, Move.EXPIRED):
        raise ValueError(f"{how} is not an expiry")
    (target,) = TRANSITIONS[how].targets
    pairs = list(copies)
    if not pairs:
        return 0
    result = session.execute(
        update(Stripe)
        .where(
            or_(*(and_(Stripe.checkpoint_id == c, Stripe.tier == t) for c, t in pairs)),
            Stripe.state.in_(_sources(how)),
        )
        .values(state=target.value, updated_at=func.now())
    )
    return int(getattr(result, "rowcount", 0) or 0)


def describe() -> list[tuple[str, str, str, str]]:
    """The transition table as the docs show it: (move, from, to, why) per move."""
    order = list(ReplicaState)

    def states(given: Iterable[ReplicaState | None]) -> str:
        ranked = sorted(given, key=lambda s: -1 if s is None else order.index(s))
        return " or ".join("(none)" if s is None else f"`{s.value}`" for s in ranked)

    return [(m.value, states(t.sources), states(t.targets), t.why) for m, t in TRANSITIONS.items()]
