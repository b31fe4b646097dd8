"""A lost or corrupt stripe moved to a new holder for its rebuild (machine.re_place) on a real
catalog: only from `lost` or `corrupt`, keeping the encoder's size and crc32c, never onto a node
that holds another stripe of its set, and verified there only by a read-back of those bytes; and
every holder's loss names its coded copy for the rebuild."""

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
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.states import ReplicaState


def _row(session: Session, shard: int, index: int) -> tuple[str, str, int, str]:
    row = session.execute(
        select(Stripe.node_id, Stripe.state, Stripe.size, Stripe.crc32c).where(
            Stripe.shard_id == shard, Stripe.stripe_index == index
        )
    ).one()
    return row.node_id, row.state, row.size, row.crc32c


def test_a_lost_stripe_moves_to_its_new_holder_and_is_verified_there_by_its_read_back(
    session: Session,
) -> None:
    cp, (shard,), holders = checkpoint(session, 1)
    stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, [shard])
    upsert_node(session, "spare", {})
    assert stripes.lose_on_node(session, holders[2], "node lost") == 1
    assert verified_stripes(session, cp, TIER) == {shard: CODE.width - 1}

    assert stripes.re_place(session, TIER, [stripes.NewHolder(shard, 2, "spare")]) == 1
    # The encoder's size and crc32c stay: the rebuilt stripe must be those bytes.
    assert _row(session, shard, 2) == ("spare", "pending", 102, "00000002")
    # Again (a retried plan): it is pending on its new holder now, not lost, so nothing moves.
    assert stripes.re_place(session, TIER, [stripes.NewHolder(shard, 2, "elsewhere")]) == 0
    assert _row(session, shard, 2)[0] == "spare"

    # Its new holder's read-back of other bytes is corrupt, of the encoder's bytes verified.
    wrong = stripes.ReadBack(shard, 2, 102, "0badf00d")
    assert stripes.read_back(session, TIER, [wrong]) == {"corrupt": 1}
    assert stripes.read_back(session, TIER, [stripes.ReadBack(shard, 2, 102, "00000002")]) == {
        "verified": 1
    }
    assert coverage(CODE, verified_stripes(session, cp, TIER)).promotable


def test_a_stripe_is_never_re_placed_onto_a_holder_of_its_set_nor_from_a_good_state(
    session: Session,
) -> None:
    cp, (shard,), holders = checkpoint(session, 1)
    stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, [shard])
    stripes.mark_bad(session, TIER, [(shard, 0)], ReplicaState.CORRUPT, "scrub")

    # holders[1] holds stripe 1 of the set: a node lost would take both.
    assert stripes.re_place(session, TIER, [stripes.NewHolder(shard, 0, holders[1])]) == 0
    assert _row(session, shard, 0)[:2] == (holders[0], "corrupt")
    # A verified stripe has a holder: a rebuild never moves it.
    upsert_node(session, "spare", {})
    assert stripes.re_place(session, TIER, [stripes.NewHolder(shard, 3, "spare")]) == 0
    assert _row(session, shard, 3)[:2] == (holders[3], "verified")
    # A corrupt one moves (its node holds no other stripe of the set but this one).
    assert stripes.re_place(session, TIER, [stripes.NewHolder(shard, 0, "spare")]) == 1
    assert _row(session, shard, 0)[:2] == ("spare", "pending")


def test_describe_shows_the_re_placed_move() -> None:
    rows = {move: (src, dst) for move, src, dst, _ in stripes.describe()}
    assert rows["re-placed"] == ("`corrupt` or `lost`", "`pending`")


def test_every_loss_of_a_holder_names_the_coded_copy_for_its_rebuild(
    session: Session,
) -> None:
    """A holder's loss names the checkpoint for a re-replication: a restorable copy is rebuilt,
    and one that the loss failed is named too, so that a rebuild under way is told (its batches
    on that node cancelled) and plans again, finding nothing to rebuild."""
    cp, shards, holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards)
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    for lost in holders[:3]:
        out = mark_lost(session, lost, ["ssd"], "test", [TIER], {TIER: CODE})
        assert [c[0] for c in out.peer_copies_lost] == [cp], lost
    assert tier_copy_state(session, cp)[0] == "failed"
