"""A stripe's state machine on a real catalog (catalog/stripe/machine.py): placed once, verified
only by a read-back that matches what the encoder cut, and every stripe of a coded copy moved by
its expiry."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import (
    CODE,
    TIER,
    checkpoint,
    placed,
    read_back_all,
)
from tierpoint.catalog.models import Stripe
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes


def test_a_stripe_is_verified_only_when_its_holder_reads_back_what_was_cut(
    session: Session,
) -> None:
    cp, (shard,), holders = checkpoint(session, 1)
    stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))  # again: no change
    # Stripe 3's holder read a flipped byte; the others read what the encoder cut.
    results = [stripes.ReadBack(shard, i, 100 + i, f"{i:08x}") for i in range(6) if i != 3]
    results.append(stripes.ReadBack(shard, 3, 103, "deadbeef"))
    assert stripes.read_back(session, TIER, results) == {"verified": 5, "corrupt": 1}
    rows = session.execute(
        select(Stripe.stripe_index, Stripe.state, Stripe.node_id).where(Stripe.shard_id == shard)
    ).all()
    assert sorted(rows) == [
        (i, "corrupt" if i == 3 else "verified", holders[i]) for i in range(CODE.width)
    ]
    counts = verified_stripes(session, cp, TIER)
    assert counts == {shard: 5}
    got = coverage(CODE, counts)
    assert not got.promotable and got.restorable and got.not_whole == [shard]
    # A read-back run again (a retried activity) moves nothing already verified.
    assert read_back_all(session, [shard]) == {"verified": 1}
    assert coverage(CODE, verified_stripes(session, cp, TIER)).promotable


def test_expiring_a_coded_copy_moves_every_one_of_its_stripes(session: Session) -> None:
    cp, shards, holders = checkpoint(session, 2)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards)
    assert stripes.expire(session, stripes.Move.EXPIRY_BEGUN, [(cp, TIER)]) == 12
    assert not coverage(CODE, verified_stripes(session, cp, TIER)).restorable
    assert stripes.expire(session, stripes.Move.EXPIRED, [(cp, TIER)]) == 12
    states = session.scalars(select(Stripe.state).where(Stripe.checkpoint_id == cp)).all()
    assert set(states) == {"expired"}
