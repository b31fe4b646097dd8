"""What retention does with the failed copies a node declared lost leaves on the nodes' own tiers
(its local copies, the peer copies it held): they expire under the tier's rules like any other
copy, never as a checkpoint's last remnant, and other failed copies stay the operator's."""

from __future__ import annotations

from datetime import timedelta

from tests.helpers.planner_builders import T0, checkpoint, good, snapshot
from tests.helpers.planner_invariants import check_plan
from tierpoint.retention import ExpiryRule, KeepReason, Policy, TierCopy, TierRef, plan
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

NOW = T0 + timedelta(days=1)
PEER_TIERS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("peer", TierKind.PEER),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
LAST_1 = Policy.from_spec({"kinds": {"local": {"keep_last": 1}, "peer": {"keep_last": 1}}})


def lost_copy(nbytes: int = 40) -> TierCopy:
    """A copy failed because a node it was on was declared lost (its siblings' bytes remain)."""
    return TierCopy(state=TierState.FAILED, verified=False, bytes=nbytes, on_lost_node=True)


def test_a_lost_nodes_failed_local_and_peer_copies_expire_under_the_tiers_rules() -> None:
    snap = snapshot(
        checkpoint(1, {"ssd": lost_copy(), "peer": lost_copy(), "lustre": good(), "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    p = plan(snap, LAST_1, NOW)
    check_plan(snap, LAST_1, NOW, p)
    gone = {(e.step, e.tier): e for e in p.expiries}
    assert set(gone) == {(1, "ssd"), (1, "peer")}
    assert all(e.rule is ExpiryRule.NOT_KEPT and e.bytes == 40 for e in gone.values())
    assert "failed" in gone[(1, "ssd")].reason and "keep_last=1" in gone[(1, "ssd")].reason


def test_kept_by_the_rules_it_stays_and_a_newer_copy_lets_it_go() -> None:
    only = snapshot(
        checkpoint(1, {"ssd": lost_copy(), "peer": lost_copy(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    p = plan(only, LAST_1, NOW)
    check_plan(only, LAST_1, NOW, p)
    assert p.expiries == ()
    assert {k.tier: k.reasons for k in p.keeps if k.step == 1 and k.tier in ("ssd", "peer")} == {
        "ssd": (KeepReason.KEEP_LAST,),
        "peer": (KeepReason.KEEP_LAST,),
    }


def test_a_checkpoint_with_no_intact_copy_keeps_its_remnants() -> None:
    """Never the last good bytes: with no intact copy anywhere, a kept checkpoint's failed local
    copy (its live nodes' shards) stays, whatever the local rules say."""
    keep_all_durable = Policy.from_spec({"kinds": {"local": {"keep_last": 0}}})
    broken = TierCopy(state=TierState.FAILED, verified=False, bytes=0)
    snap = snapshot(
        checkpoint(1, {"ssd": lost_copy(), "lustre": broken, "s3": broken}),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, keep_all_durable, NOW)
    check_plan(snap, keep_all_durable, NOW, p)
    assert (1, "ssd") not in {(e.step, e.tier) for e in p.expiries}
    assert KeepReason.NO_GOOD_COPY in next(
        k.reasons for k in p.keeps if (k.step, k.tier) == (1, "ssd")
    )


def test_a_failed_copy_no_lost_node_took_part_of_stays_the_operators() -> None:
    snap = snapshot(
        checkpoint(
            1,
            {
                "ssd": TierCopy(state=TierState.FAILED, verified=False, bytes=40),
                "lustre": good(),
                "s3": good(),
            },
        ),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, LAST_1, NOW)
    check_plan(snap, LAST_1, NOW, p)
    assert (1, "ssd") not in {(e.step, e.tier) for e in p.expiries}
    assert (1, "ssd") not in {(k.step, k.tier) for k in p.keeps}
