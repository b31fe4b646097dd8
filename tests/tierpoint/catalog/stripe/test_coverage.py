"""What a coded copy's stripes make restorable (catalog/stripe/coverage.py), on a real catalog:
promotable only with every set whole, restorable while every set keeps k verified stripes on
holders not lost, and the promotion and node loss that go by it."""

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
from tierpoint.catalog.models import Stripe
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote


def test_a_coded_copy_stays_restorable_through_m_lost_holders_and_not_one_more(
    session: Session,
) -> None:
    cp, shards, holders = checkpoint(session, 3)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    assert read_back_all(session, shards) == {"verified": 18}
    assert coverage(CODE, verified_stripes(session, cp, TIER)).promotable

    for lost, (whole, decodable) in zip(
        holders[:3], [(False, True), (False, True), (False, False)], strict=True
    ):
        mark_lost(session, lost, ["ssd"], "test")
        counts = verified_stripes(session, cp, TIER)
        got = coverage(CODE, counts)
        assert (got.promotable, got.restorable) == (whole, decodable), lost
    # m+1 = 3 holders lost: every shard is down to 3 < k stripes.
    assert verified_stripes(session, cp, TIER) == dict.fromkeys(shards, 3)
    lost_rows = session.scalars(
        select(Stripe.node_id).where(Stripe.checkpoint_id == cp, Stripe.state == "lost")
    ).all()
    assert sorted(set(lost_rows)) == sorted(holders[:3]) and len(lost_rows) == 9


def test_a_coded_copy_is_promoted_through_its_stripes_only_when_every_set_is_whole(
    session: Session,
) -> None:
    cp, shards, holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    # Every stripe but one of the second shard read back right: k+m - 1 is not whole.
    results = [stripes.ReadBack(s, i, 100 + i, f"{i:08x}") for s in shards for i in range(6)]
    stripes.read_back(session, TIER, results[:-1])
    out = promote(session, cp, TIER, [], None, CODE)
    assert out.state == "failed" and out.reason is not None
    assert f"1 of 2 shards have fewer than 6 verified stripes on {TIER} (rs(4,2))" in out.reason

    stripes.read_back(session, TIER, results[-1:])
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"


def test_a_lost_holder_fails_a_restorable_coded_copy_only_below_k_stripes(
    session: Session,
) -> None:
    cp, shards, holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards)
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    # m = 2 holders lost: every set keeps k = 4, the copy is still what a restore reads.
    for lost in holders[:2]:
        out = mark_lost(session, lost, ["ssd"], "test", [TIER], {TIER: CODE})
        assert out.tier_copies_failed == 0
        assert tier_copy_state(session, cp)[0] == "restorable"
    # One more: 3 < k stripes per set, the copy fails and says why.
    out = mark_lost(session, holders[2], ["ssd"], "test", [TIER], {TIER: CODE})
    assert out.tier_copies_failed == 1 and [c.checkpoint_id for c in out.checkpoints] == [cp]
    state, reason = tier_copy_state(session, cp)
    assert state == "failed" and holders[2] in (reason or "")
