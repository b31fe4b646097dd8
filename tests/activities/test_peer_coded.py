"""The plan of a coded copy's rebuild (activities/peer_coded.py) on a real catalog: a restorable
copy's stripes lost with their holder are re-placed on one serving node that holds none of the
set, never the shard's own, and batched for it; a copy whose sets went below k is not planned."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from activities.peer_coded import coded_stage
from tests.helpers.stripe_rows import CODE, TIER, checkpoint, placed, read_back_all, tier_copy
from tierpoint.catalog.models import Stripe
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import PlanTier
from tierpoint.tier_config import TierConfig, TierKind

CODED = TierConfig(name=TIER, kind=TierKind.PEER, root="/nodes/{node}/coded", code=str(CODE))
SOURCE = PlanTier(name="ssd", kind=TierKind.LOCAL, parallelism=1)


def _restorable(session: Session, shards: int) -> tuple[int, list[int], list[str]]:
    cp, ids, holders = checkpoint(session, shards)
    tier_copy(session, cp)
    for shard in ids:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, ids)
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    return cp, ids, holders


def _holders(session: Session, cp: int) -> dict[tuple[int, int], tuple[str, str]]:
    rows = session.execute(
        select(Stripe.shard_id, Stripe.stripe_index, Stripe.node_id, Stripe.state).where(
            Stripe.checkpoint_id == cp
        )
    )
    return {(s, i): (n, st) for s, i, n, st in rows}


def test_a_lost_holders_stripes_are_re_placed_on_one_node_holding_none_of_the_set(
    session: Session, catalog_settings: Settings
) -> None:
    cp, ids, holders = _restorable(session, 3)
    spare = f"spare-{holders[0]}"
    upsert_node(session, spare, {})
    mark_lost(session, holders[3], ["ssd"], "test", [TIER], {TIER: CODE})
    stage = coded_stage(session, catalog_settings, cp, CODED, SOURCE, CODE)
    assert stage is not None and stage.tier.code == str(CODE)
    assert stage.unplaced == [] and stage.unreachable == 0
    # The one serving node that holds none of the set and is not the shards' node.
    (new,) = {b.holder for b in stage.batches}
    assert new == spare
    assert {b.source_tier for b in stage.batches} == {TIER}
    assert sorted(o for b in stage.batches for o in range(b.first, b.last + 1)) == [0, 1, 2]
    now = _holders(session, cp)
    for shard in ids:
        assert now[(shard, 3)] == (new, "pending")
        assert {now[(shard, i)][0] for i in range(CODE.width)} == {*holders[:3], new, *holders[4:]}
    # Planned again (a retried plan, a run continued as new): the same holder, cut again there.
    again = coded_stage(session, catalog_settings, cp, CODED, SOURCE, CODE)
    assert again is not None and {b.holder for b in again.batches} == {new}
    assert _holders(session, cp) == now


def test_a_copy_below_k_is_not_rebuilt(session: Session, catalog_settings: Settings) -> None:
    cp, _, holders = _restorable(session, 1)
    for lost in holders[: CODE.m + 1]:
        mark_lost(session, lost, ["ssd"], "test", [TIER], {TIER: CODE})
    before = _holders(session, cp)
    assert coded_stage(session, catalog_settings, cp, CODED, SOURCE, CODE) is None
    assert _holders(session, cp) == before
    assert {st for n, st in before.values() if n in holders[: CODE.m + 1]} == {"lost"}
