"""Stripes found bad (catalog/tier_copy/stripe_damage.py), on a real catalog: each moved `found
bad` once, no longer counted by coverage, and the coded copy failed only once some set is left
below k; a pending copy is left to its promotion."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import (
    CODE,
    TIER,
    checkpoint,
    placed,
    read_back_all,
    tier_copy,
    tier_copy_state,
)
from tierpoint.catalog.models import Event, Stripe
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import verified_stripes
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.states import ReplicaState


def _ids(session: Session, shard: int) -> list[tuple[int, int]]:
    return [(shard, i) for i in range(CODE.width)]


def test_stripes_found_bad_stop_counting_and_fail_the_copy_only_below_k(session: Session) -> None:
    cp, shards, holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards)
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    first = _ids(session, shards[0])

    # m = 2 stripes of one set bad: it keeps k = 4, the copy stays what a restore reads.
    out = mark_stripes_damaged(
        session, TIER, CODE, {first[0]: "crc32c differs"}, ReplicaState.CORRUPT, "scrub"
    )
    assert (out.marked, out.demoted, out.checkpoints) == (1, {}, {cp})
    out = mark_stripes_damaged(session, TIER, CODE, {first[5]: "gone"}, ReplicaState.LOST, "scrub")
    assert out.marked == 1 and out.demoted == {}
    assert verified_stripes(session, cp, TIER) == {shards[0]: 4, shards[1]: 6}
    assert tier_copy_state(session, cp)[0] == "restorable"

    # Again: already moved, nothing changes.
    again = mark_stripes_damaged(
        session, TIER, CODE, {first[0]: "crc32c differs"}, ReplicaState.CORRUPT, "scrub"
    )
    assert (again.marked, again.checkpoints) == (0, set())

    # One more: below k, the coded copy fails and says which stripe.
    out = mark_stripes_damaged(
        session, TIER, CODE, {first[2]: "size 3 != 100"}, ReplicaState.CORRUPT, "scrub"
    )
    assert out.demoted == {cp: [TIER]}
    state, reason = tier_copy_state(session, cp)
    assert state == "failed" and reason is not None
    assert "1 stripe(s) corrupt" in reason and "stripe 2 (size 3 != 100)" in reason, reason
    states = session.scalars(select(Stripe.state).where(Stripe.shard_id == shards[0])).all()
    assert sorted(states) == ["corrupt", "corrupt", "lost", "verified", "verified", "verified"]
    kinds = session.scalars(
        select(Event.kind).where(Event.checkpoint_id == cp, Event.tier == TIER).order_by(Event.id)
    ).all()
    assert [k for k in kinds if k in ("corrupt", "lost")] == ["corrupt", "lost", "corrupt"]


def test_a_pending_coded_copy_is_left_to_its_promotion(session: Session) -> None:
    cp, shards, holders = checkpoint(session, 1)
    tier_copy(session, cp)
    stripes.place(session, cp, TIER, str(CODE), placed(shards[0], holders))
    read_back_all(session, shards)
    ids = _ids(session, shards[0])
    out = mark_stripes_damaged(
        session, TIER, CODE, dict.fromkeys(ids[:3], "bad"), ReplicaState.CORRUPT, "scrub"
    )
    assert out.marked == 3 and out.demoted == {}
    assert tier_copy_state(session, cp)[0] == "pending"
    assert promote(session, cp, TIER, [], None, CODE).state == "failed"
