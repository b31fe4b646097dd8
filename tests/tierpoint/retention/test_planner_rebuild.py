"""Retention and re-made copies: while re-replication or repair makes a failed copy again from
another tier's copy of the checkpoint (a peer tier from the shared tier or S3 after a node and the
holder of its copy were both lost; a local or shared copy repair reads from a slower tier), that
source copy stays (`rebuild_source`), whatever the rules and quotas say, and the copy being made
is in flight. The hold is the catalog's (`TierCopy.rebuild_from`, only while it has not lapsed):
without it, the same copies are decided as before."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given

from tests.helpers.planner_builders import T0, checkpoint, good, snapshot
from tests.helpers.planner_invariants import check_plan
from tierpoint.retention import ExpiryRule, KeepReason, Policy, TierCopy, TierRef, plan
from tierpoint.retention.models import CheckpointInfo, RetentionSnapshot
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

from .test_planner_properties import SETTINGS, cases

NOW = T0 + timedelta(days=1)
PEER_TIERS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("peer", TierKind.PEER),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
# Step 1 is wanted off every tier but S3 (step 2 is newer), and lustre is over its quota.
LAST_1 = Policy.from_spec(
    {
        "kinds": {
            "local": {"keep_last": 1},
            "peer": {"keep_last": 1},
            "shared": {"keep_last": 1, "max_bytes": 100},
        }
    }
)


def rebuilding(*sources: str) -> TierCopy:
    """A peer copy failed with its lost holder, being made again from `sources`."""
    return TierCopy(
        state=TierState.FAILED,
        verified=False,
        bytes=40,
        on_lost_node=True,
        rebuild_from=frozenset(sources),
    )


def _decisions(
    snap: RetentionSnapshot,
) -> tuple[set[tuple[int, str]], dict[tuple[int, str], tuple[KeepReason, ...]]]:
    p = plan(snap, LAST_1, NOW)
    check_plan(snap, LAST_1, NOW, p)
    return {(e.step, e.tier) for e in p.expiries}, {(k.step, k.tier): k.reasons for k in p.keeps}


def test_the_tier_a_peer_copy_is_made_again_from_stays_until_the_copy_is_made() -> None:
    """A node and its holder both lost: the peer copy of step 1 is re-made from lustre. lustre's
    copy stays, over its keep_last and its quota; the ssd copy (the node is lost: its shards
    are not read) and S3 go by their rules as before; the failed peer copy is in flight."""
    held = snapshot(
        checkpoint(
            1, {"ssd": good(), "peer": rebuilding("lustre"), "lustre": good(), "s3": good()}
        ),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    gone, kept = _decisions(held)
    assert (1, "lustre") not in gone
    assert kept[(1, "lustre")] == (KeepReason.REBUILD_SOURCE,)
    assert (1, "ssd") in gone
    assert (1, "peer") not in gone and (1, "peer") not in kept

    # Made or given up, the promotion clears the hold (or it lapsed): lustre's copy goes.
    released = held.model_copy(
        update={
            "checkpoints": tuple(
                c.model_copy(
                    update={
                        "copies": {
                            **c.copies,
                            "peer": c.copies["peer"].model_copy(
                                update={"rebuild_from": frozenset()}
                            ),
                        }
                    }
                )
                for c in held.checkpoints
            )
        }
    )
    gone, kept = _decisions(released)
    assert {(1, "lustre"), (1, "peer"), (1, "ssd")} <= gone


def test_a_coded_copy_cut_again_from_its_own_stripes_stays_until_its_rebuild_ends() -> None:
    """A restorable coded copy whose rebuild cuts its bad stripes again from its other stripes
    holds its own tier: a policy that wants it gone keeps it (`rebuild_source`) until the
    rebuild's promotion releases the hold, and then expires it."""
    coded = good().model_copy(update={"rebuild_from": frozenset({"peer"})})
    held = snapshot(
        checkpoint(1, {"ssd": good(), "peer": coded, "lustre": good(), "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    gone, kept = _decisions(held)
    assert (1, "peer") not in gone
    assert kept[(1, "peer")] == (KeepReason.REBUILD_SOURCE,)

    released = held.model_copy(
        update={
            "checkpoints": tuple(
                c.model_copy(update={"copies": {**c.copies, "peer": good()}})
                for c in held.checkpoints
            )
        }
    )
    gone, _ = _decisions(released)
    assert (1, "peer") in gone


def test_a_held_copy_never_stands_in_for_the_lasting_last_copy() -> None:
    """The peer tier keeps step 1 (a rule that keeps everything there) while it is re-made from
    lustre; lustre and S3 no longer want it. The hold ends with the rebuild, so it is S3's copy,
    the most durable, that stays as the last copy, not lustre's alone."""
    durable_last_1 = Policy.from_spec(
        {
            "kinds": {"local": {"keep_last": 1}, "peer": {}, "shared": {"keep_last": 1}},
            "durable": {"keep_last": 1},
        }
    )
    snap = snapshot(
        checkpoint(
            1, {"ssd": good(), "peer": rebuilding("lustre"), "lustre": good(), "s3": good()}
        ),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    p = plan(snap, durable_last_1, NOW)
    check_plan(snap, durable_last_1, NOW, p)
    kept = {(k.step, k.tier): k.reasons for k in p.keeps}
    assert kept[(1, "lustre")] == (KeepReason.REBUILD_SOURCE,)
    assert kept[(1, "s3")] == (KeepReason.LAST_COPY,)
    assert {(e.step, e.tier) for e in p.expiries} == {(1, "ssd")}


def test_a_quarantined_copy_holds_no_source() -> None:
    """Neither re-replication nor repair makes a quarantined copy again."""
    quarantined = rebuilding("lustre").model_copy(update={"quarantined": True, "evidence": True})
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "peer": quarantined, "lustre": good(), "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    gone, _ = _decisions(snap)
    assert (1, "lustre") in gone


def test_a_repair_reading_a_faster_tier_holds_it_too() -> None:
    """Repair of a damaged lustre copy reads the shard's node's local copy (the fastest verified
    source): that one stays, though S3 is intact and ssd's keep_last lets it go."""
    damaged = TierCopy(
        state=TierState.FAILED, verified=False, bytes=100, rebuild_from=frozenset({"ssd"})
    )
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "peer": good(), "lustre": damaged, "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    gone, kept = _decisions(snap)
    assert (1, "ssd") not in gone and KeepReason.REBUILD_SOURCE in kept[(1, "ssd")]
    assert (1, "peer") in gone


def _without_holds(snap: RetentionSnapshot) -> RetentionSnapshot:
    def bare(c: CheckpointInfo) -> CheckpointInfo:
        copies = {
            n: x.model_copy(update={"rebuild_from": frozenset()}) for n, x in c.copies.items()
        }
        return c.model_copy(update={"copies": copies})

    return snap.model_copy(update={"checkpoints": tuple(bare(c) for c in snap.checkpoints)})


@SETTINGS
@given(cases())
def test_a_hold_only_keeps_what_it_names_and_nothing_it_names_expires(
    case: tuple[RetentionSnapshot, Policy, datetime],
) -> None:
    """Against the same snapshot without holds: a hold never expires a copy the bare plan kept,
    and every copy a live hold names on a failed, unquarantined copy being made stays,
    protected."""
    snap, policy, now = case
    p = plan(snap, policy, now)
    check_plan(snap, policy, now, p)
    bare = plan(_without_holds(snap), policy, now)
    gone = {(e.checkpoint_id, e.tier) for e in p.expiries}
    for c in snap.checkpoints:
        for name, copy in c.copies.items():
            if copy.state != TierState.FAILED or copy.quarantined:
                continue
            for src in copy.rebuild_from - {name}:
                assert (c.id, src) not in gone
                keep = next((k for k in p.keeps if (k.checkpoint_id, k.tier) == (c.id, src)), None)
                if keep is not None:
                    assert keep.protected and KeepReason.REBUILD_SOURCE in keep.reasons
    # Holds only keep: with a quota, what a hold keeps may make another copy go in its place,
    # never a protected one (the invariants check that on the plan itself).
    if all(u.max_bytes is None for u in p.usage):
        assert gone <= {(e.checkpoint_id, e.tier) for e in bare.expiries}


def test_example_rule_is_not_kept_under_the_bare_plan() -> None:
    """Sanity of the fixture: without the hold lustre's step 1 goes by a rule (keep_last or the
    quota), so the keep above is the hold's doing."""
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "lustre": good(), "s3": good()}),
        tiers=PEER_TIERS,
    )
    p = plan(snap, LAST_1, NOW)
    rules = {(e.step, e.tier): e.rule for e in p.expiries}
    assert rules[(1, "lustre")] in (ExpiryRule.NOT_KEPT, ExpiryRule.MAX_BYTES)
