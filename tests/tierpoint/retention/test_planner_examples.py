"""Exact outcomes of the planner on small, hand-checked histories."""

from __future__ import annotations

from datetime import timedelta

from tests.helpers.planner_builders import (
    T0,
    apply,
    checkpoint,
    good,
    holding,
    run_history,
    snapshot,
)
from tierpoint.retention import (
    DEFAULT_POLICY,
    ExpiryRule,
    KeepReason,
    Policy,
    RetentionPlan,
    TierCopy,
    TierRef,
    plan,
)
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

ISSUE_POLICY = Policy.from_spec(
    {
        "tiers": {
            "ssd": {"keep_last": 2},
            "lustre": {"keep_last": 4},
            "s3": {"promote_every": 3, "keep_every": 6},
        }
    }
)
ISSUE_OUTCOME = {"ssd": [11, 12], "lustre": [9, 10, 11, 12], "s3": [6, 12]}


def pending() -> TierCopy:
    return TierCopy(state=TierState.PENDING, verified=False, bytes=0)


def failed() -> TierCopy:
    return TierCopy(state=TierState.FAILED, verified=False, bytes=40)


def kept(p: RetentionPlan) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for k in p.keeps:
        out.setdefault(k.tier, []).append(k.step)
    return out


def expired(p: RetentionPlan) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in p.expiries:
        out.setdefault(e.tier, []).append(e.step)
    return out


def reasons(p: RetentionPlan, step: int, tier: str) -> tuple[KeepReason, ...]:
    return next(k.reasons for k in p.keeps if k.step == step and k.tier == tier)


def test_issue_scenario_run_step_by_step() -> None:
    """keep_last=2 on local, 4 on shared, promote_every=3 and keep_every=6 on S3, 12 checkpoints,
    retention after every promotion."""
    final = run_history(ISSUE_POLICY, list(range(1, 13)))
    assert holding(final) == ISSUE_OUTCOME
    # Nothing left to do, and the newest checkpoint is restorable everywhere.
    assert plan(final, ISSUE_POLICY, T0 + timedelta(days=1)).expiries == ()


def test_issue_scenario_in_one_plan() -> None:
    """The same outcome when retention first runs after all 12 were promoted."""
    snap = snapshot(
        *(
            checkpoint(
                s, {"ssd": good(), "lustre": good(), **({"s3": good()} if s % 3 == 0 else {})}
            )
            for s in range(1, 13)
        )
    )
    p = plan(snap, ISSUE_POLICY, T0 + timedelta(days=1))
    assert kept(p) == ISSUE_OUTCOME
    assert expired(p) == {
        "ssd": list(range(1, 11)),
        "lustre": list(range(1, 9)),
        "s3": [3, 9],
    }
    assert reasons(p, 12, "s3") == (KeepReason.LATEST_DURABLE, KeepReason.KEEP_EVERY_STEPS)
    assert reasons(p, 6, "s3") == (KeepReason.KEEP_EVERY_STEPS,)
    assert reasons(p, 11, "ssd") == (KeepReason.KEEP_LAST,)
    s3_9 = next(e for e in p.expiries if e.tier == "s3" and e.step == 9)
    assert s3_9.rule is ExpiryRule.NOT_KEPT
    assert "keep_every.steps=6" in s3_9.reason
    assert [(u.tier, u.bytes_now, u.bytes_after) for u in p.usage] == [
        ("ssd", 1200, 200),
        ("lustre", 1200, 400),
        ("s3", 400, 200),
    ]
    assert apply(snap, p) == apply(snap, p)  # plans are values
    assert holding(apply(snap, p)) == ISSUE_OUTCOME


def test_default_policy_history() -> None:
    final = run_history(DEFAULT_POLICY, list(range(0, 1000, 100)))
    assert holding(final) == {
        "ssd": [800, 900],
        "lustre": [600, 700, 800, 900],
        "s3": list(range(0, 1000, 100)),
    }


def test_keep_within_and_tags() -> None:
    policy = Policy.from_spec(
        {"tiers": {"lustre": {"keep_within": "3h", "keep_tags": ["best"]}, "ssd": {"keep_last": 0}}}
    )
    snap = snapshot(
        *(
            checkpoint(
                s,
                {"ssd": good(), "lustre": good(), "s3": good()},
                tags=frozenset({"best"}) if s == 2 else frozenset(),
            )
            for s in range(1, 11)
        )
    )
    # Checkpoint s was made at T0 + s hours; at T0+10h those within 3h are steps 7..10.
    p = plan(snap, policy, T0 + timedelta(hours=10))
    assert kept(p)["lustre"] == [2, 7, 8, 9, 10]
    assert reasons(p, 2, "lustre") == (KeepReason.KEEP_TAGS,)
    assert reasons(p, 7, "lustre") == (KeepReason.KEEP_WITHIN,)
    assert "ssd" not in kept(p)  # keep_last=0: every local copy is safe on slower tiers
    assert kept(p)["s3"] == list(range(1, 11))  # the most durable tier keeps everything


def test_keep_every_interval_keeps_the_first_of_each_day() -> None:
    policy = Policy.from_spec({"tiers": {"s3": {"keep_every": "1d", "keep_last": 1}}})
    # every 6 hours over three days, starting at 03:00
    snap = snapshot(
        *(
            checkpoint(s, {"s3": good()}, created_at=T0 + timedelta(hours=3 + 6 * s))
            for s in range(12)
        ),
        tiers=(TierRef("s3", TierKind.S3),),
    )
    p = plan(snap, policy, T0 + timedelta(days=5))
    assert kept(p)["s3"] == [0, 4, 8, 11]
    assert reasons(p, 4, "s3") == (KeepReason.KEEP_EVERY_INTERVAL,)
    assert reasons(p, 11, "s3") == (KeepReason.LATEST_DURABLE, KeepReason.KEEP_LAST)


def evidence() -> TierCopy:
    """A good copy an operator quarantined."""
    return good().model_copy(update={"quarantined": True, "evidence": True})


def test_pins_leases_and_quarantine_hold_copies_everywhere() -> None:
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 0}, "shared": {"keep_last": 0}}})
    everywhere = {"ssd": good(), "lustre": good(), "s3": good()}
    snap = snapshot(
        checkpoint(1, everywhere, pinned=True),
        checkpoint(2, everywhere, leased=True),
        checkpoint(3, everywhere, quarantined=True, evidence=True),
        checkpoint(
            4,
            {**everywhere, "lustre": evidence()},
        ),
        checkpoint(5, everywhere),
    )
    p = plan(snap, policy, T0)
    assert kept(p) == {"ssd": [1, 2, 3], "lustre": [1, 2, 3, 4], "s3": [1, 2, 3, 4, 5]}
    assert reasons(p, 1, "ssd") == (KeepReason.PINNED,)
    assert reasons(p, 2, "lustre") == (KeepReason.LEASED,)
    # The operator's quarantine holds the copies; they are intact, so nothing else does.
    assert reasons(p, 3, "ssd") == (KeepReason.QUARANTINED,)
    assert reasons(p, 4, "lustre") == (KeepReason.QUARANTINED,)


def test_a_training_jobs_quarantine_hides_but_does_not_hold() -> None:
    """A job's quarantine (a failed load) is no evidence: its copies stay while and where the
    policy keeps them, like any checkpoint's, and no longer; they just are not restorable. The
    expensive tiers are not held for it, not even through the protections a hidden checkpoint
    would get if its copies counted as lost (awaiting a durable copy, no good copy left)."""
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}}})
    everywhere = {"ssd": good(), "lustre": good(), "s3": good()}
    hidden_lustre = {**everywhere, "lustre": good().model_copy(update={"quarantined": True})}
    snap = snapshot(
        checkpoint(1, everywhere, quarantined=True),
        checkpoint(2, hidden_lustre),
        checkpoint(3, everywhere),
    )
    p = plan(snap, policy, T0)
    assert expired(p) == {"ssd": [1, 2], "lustre": [1, 2]}
    assert kept(p) == {"ssd": [3], "lustre": [3], "s3": [1, 2, 3]}
    # The durable tier keeps everything (no rules): the hidden checkpoint is kept by that rule
    # only, not as evidence.
    assert reasons(p, 1, "s3") == (KeepReason.KEEP_ALL,)
    # The same snapshot with the operator's word keeps every copy.
    held = snapshot(
        checkpoint(1, everywhere, quarantined=True, evidence=True),
        checkpoint(
            2,
            {**everywhere, "lustre": evidence()},
        ),
        checkpoint(3, everywhere),
    )
    p = plan(held, policy, T0)
    assert expired(p) == {"ssd": [2]}
    assert reasons(p, 1, "ssd") == (KeepReason.QUARANTINED,)
    assert reasons(p, 2, "lustre") == (KeepReason.QUARANTINED,)


def test_local_copy_stays_until_restorable_on_a_more_durable_target() -> None:
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 0}}})
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "lustre": pending()}),
        checkpoint(2, {"ssd": good(), "lustre": failed()}),
        checkpoint(3, {"ssd": good(), "lustre": good(), "s3": pending()}),
        checkpoint(4, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, policy, T0)
    assert reasons(p, 1, "ssd") == (KeepReason.IN_FLIGHT, KeepReason.AWAITING_DURABLE)
    assert reasons(p, 2, "ssd") == (KeepReason.AWAITING_DURABLE,)
    assert reasons(p, 3, "ssd") == (KeepReason.IN_FLIGHT,)
    assert reasons(p, 3, "lustre") == (KeepReason.IN_FLIGHT, KeepReason.KEEP_ALL)
    assert expired(p) == {"ssd": [4]}


def test_local_only_checkpoints_follow_local_rules() -> None:
    """With promote_every on every slower tier, odd steps live on the local tier only; its rules
    decide, and nothing keeps them anywhere else."""
    policy = Policy.from_spec(
        {
            "tiers": {
                "ssd": {"keep_last": 1},
                "lustre": {"promote_every": 2},
                "s3": {"promote_every": 2},
            }
        }
    )
    final = run_history(policy, [1, 2, 3, 4, 5])
    assert holding(final) == {"ssd": [5], "lustre": [2, 4], "s3": [2, 4]}


def test_last_good_copy_of_a_kept_checkpoint_stays() -> None:
    """S3 (keeps everything) failed to take step 1: the shared copy is its only good copy."""
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 0}, "shared": {"keep_last": 1}}})
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "lustre": good(), "s3": failed()}),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, policy, T0)
    assert reasons(p, 1, "lustre") == (KeepReason.LAST_COPY,)
    assert expired(p) == {"ssd": [1, 2]}


def test_a_checkpoint_no_tier_keeps_may_lose_its_last_copy() -> None:
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "lustre": good()}),
        checkpoint(2, {"ssd": good(), "lustre": good()}),
        checkpoint(3, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, ISSUE_POLICY, T0)
    assert expired(p) == {"ssd": [1]}
    p = plan(
        snap,
        Policy.from_spec(
            {
                "tiers": {"s3": {"promote_every": 3}},
                "kinds": {"local": {"keep_last": 0}, "shared": {"keep_last": 1}},
            }
        ),
        T0,
    )
    assert expired(p) == {"ssd": [1, 2, 3], "lustre": [1, 2]}


def test_a_kept_checkpoint_without_any_good_copy_keeps_its_remnants() -> None:
    broken = TierCopy(state=TierState.RESTORABLE, verified=False, bytes=10)
    snap = snapshot(
        checkpoint(1, {"ssd": broken, "lustre": failed(), "s3": failed()}),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, DEFAULT_POLICY, T0)
    assert reasons(p, 1, "ssd") == (
        KeepReason.AWAITING_DURABLE,
        KeepReason.NO_GOOD_COPY,
        KeepReason.KEEP_LAST,
    )
    # Not kept anywhere (meant for the local tier only, which keeps none): the remnant may go.
    skip = Policy.from_spec(
        {
            "tiers": {"lustre": {"promote_every": 2}, "s3": {"promote_every": 2}},
            "kinds": {"local": {"keep_last": 0}},
        }
    )
    snap = snapshot(
        checkpoint(1, {"ssd": broken}),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, skip, T0)
    assert [(e.step, e.tier, e.rule) for e in p.expiries] == [
        (1, "ssd", ExpiryRule.NOT_KEPT),
        (2, "ssd", ExpiryRule.NOT_KEPT),
    ]
    assert "not verified" in p.expiries[0].reason


def test_latest_durable_is_held_whatever_the_rules() -> None:
    policy = Policy.from_spec({"durable": {"keep_last": 0}})
    snap = snapshot(
        checkpoint(1, {"s3": good()}),
        checkpoint(2, {"s3": good()}),
        checkpoint(3, {"s3": pending()}),
    )
    p = plan(snap, policy, T0)
    assert expired(p) == {"s3": [1]}
    assert reasons(p, 2, "s3") == (KeepReason.LATEST_DURABLE,)


def test_quota_expires_the_oldest_first_and_stops_when_met() -> None:
    policy = Policy.from_spec({"kinds": {"shared": {"max_bytes": 300}}})
    snap = snapshot(*(checkpoint(s, {"lustre": good(), "s3": good()}) for s in range(1, 6)))
    p = plan(snap, policy, T0)
    assert expired(p) == {"lustre": [1, 2]}
    assert {e.rule for e in p.expiries} == {ExpiryRule.MAX_BYTES}
    usage = {u.tier: u for u in p.usage}
    assert (usage["lustre"].bytes_after, usage["lustre"].quota_met) == (300, True)
    assert usage["s3"].quota_met is None


def test_quota_that_protections_prevent_is_reported() -> None:
    policy = Policy.from_spec({"kinds": {"shared": {"max_bytes": 150}}})
    snap = snapshot(
        checkpoint(1, {"lustre": good(), "s3": failed()}),  # last good copy; s3 keeps it
        checkpoint(2, {"lustre": good(), "s3": good()}, pinned=True),
        checkpoint(3, {"lustre": good(), "s3": good()}),
    )
    p = plan(snap, policy, T0)
    assert expired(p) == {"lustre": [3]}
    usage = {u.tier: u for u in p.usage}["lustre"]
    assert (usage.bytes_now, usage.bytes_after, usage.quota_met, usage.over_by) == (
        300,
        200,
        False,
        50,
    )
    assert reasons(p, 1, "lustre") == (KeepReason.LAST_COPY, KeepReason.KEEP_ALL)
    assert reasons(p, 2, "lustre") == (KeepReason.PINNED, KeepReason.KEEP_ALL)


def test_quota_on_the_most_durable_tier_decides_the_last_copy() -> None:
    policy = Policy.from_spec({"durable": {"max_bytes": 200}})
    snap = snapshot(*(checkpoint(s, {"s3": good()}) for s in range(1, 5)))
    p = plan(snap, policy, T0)
    assert expired(p) == {"s3": [1, 2]}
    assert all(e.rule is ExpiryRule.MAX_BYTES for e in p.expiries)


def test_unfinished_expiries_are_listed_and_counted_as_gone() -> None:
    expiring = TierCopy(state=TierState.EXPIRING, verified=False, bytes=70)
    snap = snapshot(
        checkpoint(1, {"lustre": expiring, "s3": good()}, pinned=True),
        checkpoint(2, {"lustre": good(), "s3": good()}),
    )
    p = plan(snap, DEFAULT_POLICY, T0)
    assert [(u.step, u.tier, u.bytes) for u in p.unfinished] == [(1, "lustre", 70)]
    usage = {u.tier: u for u in p.usage}["lustre"]
    assert (usage.bytes_now, usage.bytes_after) == (170, 100)
    assert expired(p) == {}


def test_notes_for_tiers_the_configuration_does_not_have() -> None:
    policy = Policy.from_spec({"tiers": {"tape": {"keep_last": 1}}})
    snap = snapshot(checkpoint(1, {"s3": good(), "old-nfs": good()}))
    p = plan(snap, policy, T0)
    assert p.notes == (
        "the policy has rules for tier 'tape', which is not configured",
        "copies on unconfigured tier 'old-nfs' are left alone",
    )
    assert [k.tier for k in p.keeps] == ["s3"]


def test_pending_markers_on_tiers_a_checkpoint_is_not_meant_for_hold_nothing() -> None:
    """Registration may create a pending marker on every tier; with promote_every=3 on s3 the
    s3 markers of steps 1, 2, 4, ... stay pending forever and must not hold their sources."""
    snap = snapshot(
        *(
            checkpoint(
                s, {"ssd": good(), "lustre": good(), "s3": good() if s % 3 == 0 else pending()}
            )
            for s in range(1, 13)
        )
    )
    p = plan(snap, ISSUE_POLICY, T0 + timedelta(days=1))
    assert kept(p) == ISSUE_OUTCOME


def test_a_local_copy_does_not_wait_for_a_tier_that_let_the_checkpoint_go() -> None:
    """Its shared copy was expired on purpose (here by a quota) and s3 never wanted it: the local
    copy is not waiting for anything, and the local rules decide."""
    policy = Policy.from_spec({"tiers": {"ssd": {"keep_last": 1}, "s3": {"promote_every": 2}}})
    gone = TierCopy(state=TierState.EXPIRED, verified=False, bytes=0)
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "lustre": gone}),
        checkpoint(2, {"ssd": good(), "lustre": good(), "s3": good()}),
    )
    p = plan(snap, policy, T0)
    assert expired(p) == {"ssd": [1]}
    # While s3 still expects it, the local copy waits.
    snap = snapshot(
        checkpoint(2, {"ssd": good(), "lustre": gone, "s3": failed()}),
        checkpoint(3, {"ssd": good(), "lustre": good()}),
    )
    p = plan(snap, policy, T0)
    assert reasons(p, 2, "ssd") == (KeepReason.AWAITING_DURABLE,)
