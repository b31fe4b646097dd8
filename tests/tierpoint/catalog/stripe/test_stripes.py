"""A coded peer tier's stripes on a real catalog: placed once, verified only by a read-back that
matches what the encoder cut, lost with their holder; a coded copy promotable only with every set
whole and restorable while every set keeps k verified stripes on holders not lost."""

from __future__ import annotations

import uuid

from sqlalchemy import insert, select
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.models import Checkpoint, Job, Shard, Stripe, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote

CODE = Code(4, 2)
TIER = "stripes"


def _checkpoint(session: Session, shards: int) -> tuple[int, list[int], list[str]]:
    """A checkpoint of `shards` shards on node `src`, and the k+m holders of its stripes."""
    tag = uuid.uuid4().hex[:8]
    nodes = [f"src-{tag}", *(f"h{i}-{tag}" for i in range(CODE.width))]
    for node in nodes:
        upsert_node(session, node, {})
    job = session.scalar(insert(Job).values(name=f"job-{tag}").returning(Job.id))
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job, step=1, total_bytes=shards, shard_count=shards, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    assert cp is not None
    ids = [
        session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=i, path=f"f{i}", size=1, node_id=nodes[0])
            .returning(Shard.id)
        )
        for i in range(shards)
    ]
    return cp, [i for i in ids if i is not None], nodes[1:]


def _placed(shard: int, holders: list[str]) -> list[stripes.PlacedStripe]:
    return [stripes.PlacedStripe(shard, i, h, 100 + i, f"{i:08x}") for i, h in enumerate(holders)]


def _read_back_all(session: Session, shards: list[int]) -> dict[str, int]:
    results = [stripes.ReadBack(s, i, 100 + i, f"{i:08x}") for s in shards for i in range(6)]
    return stripes.read_back(session, TIER, results)


def test_a_stripe_is_verified_only_when_its_holder_reads_back_what_was_cut(
    session: Session,
) -> None:
    cp, (shard,), holders = _checkpoint(session, 1)
    stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))
    stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))  # again: no change
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
    assert _read_back_all(session, [shard]) == {"verified": 1}
    assert coverage(CODE, verified_stripes(session, cp, TIER)).promotable


def test_a_coded_copy_stays_restorable_through_m_lost_holders_and_not_one_more(
    session: Session,
) -> None:
    cp, shards, holders = _checkpoint(session, 3)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))
    assert _read_back_all(session, shards) == {"verified": 18}
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


def test_expiring_a_coded_copy_moves_every_one_of_its_stripes(session: Session) -> None:
    cp, shards, holders = _checkpoint(session, 2)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))
    _read_back_all(session, shards)
    assert stripes.expire(session, stripes.Move.EXPIRY_BEGUN, [(cp, TIER)]) == 12
    assert not coverage(CODE, verified_stripes(session, cp, TIER)).restorable
    assert stripes.expire(session, stripes.Move.EXPIRED, [(cp, TIER)]) == 12
    states = session.scalars(select(Stripe.state).where(Stripe.checkpoint_id == cp)).all()
    assert set(states) == {"expired"}


def _tier_copy(session: Session, cp: int) -> None:
    job_id, step = session.execute(
        select(Checkpoint.job_id, Checkpoint.step).where(Checkpoint.id == cp)
    ).one()
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier=TIER, job_id=job_id, step=step))


def _state(session: Session, cp: int) -> tuple[str, str | None]:
    state, reason = session.execute(
        select(TierCopy.state, TierCopy.reason).where(
            TierCopy.checkpoint_id == cp, TierCopy.tier == TIER
        )
    ).one()
    return state, reason


def test_a_coded_copy_is_promoted_through_its_stripes_only_when_every_set_is_whole(
    session: Session,
) -> None:
    cp, shards, holders = _checkpoint(session, 2)
    _tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))
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
    cp, shards, holders = _checkpoint(session, 2)
    _tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), _placed(shard, holders))
    _read_back_all(session, shards)
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    # m = 2 holders lost: every set keeps k = 4, the copy is still what a restore reads.
    for lost in holders[:2]:
        out = mark_lost(session, lost, ["ssd"], "test", [TIER], {TIER: CODE})
        assert out.tier_copies_failed == 0
        assert _state(session, cp)[0] == "restorable"
    # One more: 3 < k stripes per set, the copy fails and says why.
    out = mark_lost(session, holders[2], ["ssd"], "test", [TIER], {TIER: CODE})
    assert out.tier_copies_failed == 1 and [c.checkpoint_id for c in out.checkpoints] == [cp]
    state, reason = _state(session, cp)
    assert state == "failed" and holders[2] in (reason or "")
