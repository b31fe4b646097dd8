"""Hypothesis: random histories, marker and replica states, pins, leases, tags, quotas and policies.
No plan may break a safety rule; plans are deterministic; quotas are met whenever they can be."""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.helpers.planner_builders import T0, apply, run_history
from tests.helpers.planner_invariants import PROTECTIONS as STATED_PROTECTIONS
from tests.helpers.planner_invariants import check_plan, keeps_everything, rule_of, targets
from tierpoint.retention import (
    CheckpointInfo,
    KeepEvery,
    Policy,
    RetentionPlan,
    RetentionSnapshot,
    TierCopy,
    TierRef,
    TierRule,
    plan,
    promotion_targets,
)
from tierpoint.retention.models import PROTECTIONS
from tierpoint.retention.policy import parse_duration
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

# Sized to keep the suite well under a minute on a busy 2-core machine; raise it for a soak run:
# TIERPOINT_RETENTION_EXAMPLES=20000 pytest tests/tierpoint/retention
EXAMPLES = int(os.environ.get("TIERPOINT_RETENTION_EXAMPLES", "700"))
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

tier_lists = st.integers(min_value=1, max_value=4).flatmap(
    lambda n: st.tuples(
        *(
            st.just(TierKind.LOCAL)
            if i == 0
            else st.sampled_from([TierKind.LOCAL, TierKind.PEER, TierKind.SHARED])
            if i < n - 1
            else st.sampled_from([TierKind.PEER, TierKind.SHARED, TierKind.S3])
            for i in range(n)
        )
    ).map(lambda kinds: tuple(TierRef(f"t{i}", k) for i, k in enumerate(kinds)))
)

durations = st.sampled_from(["30m", "2h", "6h", "1d"]).map(parse_duration)

rules = st.builds(
    TierRule,
    keep_last=st.none() | st.integers(min_value=0, max_value=4),
    keep_every=st.none()
    | st.builds(KeepEvery, steps=st.integers(min_value=1, max_value=6), interval=st.none())
    | st.builds(KeepEvery, steps=st.none(), interval=durations),
    keep_within=st.sampled_from([None, None, None, 1]).flatmap(
        lambda x: durations if x else st.none()
    ),
    keep_tags=st.sampled_from([(), (), (), ("best",), ("best", "keep")]),
    max_bytes=st.none() | st.integers(min_value=0, max_value=1500),
    promote_every=st.sampled_from([1, 1, 2, 3]),
)


@st.composite
def policies(draw: st.DrawFn, tiers: tuple[TierRef, ...]) -> Policy:
    named = {t.name: draw(rules) for t in tiers if draw(st.integers(0, 9)) < 8}
    kinds = {}
    for kind in (TierKind.PEER, TierKind.SHARED, TierKind.S3):
        if draw(st.booleans()):
            kinds[kind] = draw(rules)
    local = draw(st.none() | rules)
    if local is not None:
        kinds[TierKind.LOCAL] = local.model_copy(update={"promote_every": 1})
    durable = draw(st.none() | rules)
    return Policy(tiers=named, kinds=kinds, durable=durable)


copies = st.builds(
    TierCopy,
    state=st.sampled_from(
        [TierState.RESTORABLE] * 8
        + [TierState.PENDING, TierState.FAILED, TierState.EXPIRING, TierState.EXPIRED]
    ),
    verified=st.sampled_from([True] * 7 + [False]),
    bytes=st.integers(min_value=0, max_value=300),
    quarantined=st.sampled_from([False] * 15 + [True]),
    # an operator's quarantine (evidence) or a training job's
    evidence=st.booleans(),
    # part of it on a node declared lost
    on_lost_node=st.sampled_from([False] * 3 + [True]),
    # being made again (re-replication, repair) from these tiers' copies, while the hold lasts
    rebuild_from=st.sampled_from(
        [frozenset()] * 8 + [frozenset({f"t{i}"}) for i in range(4)] + [frozenset({"t0", "t2"})]
    ),
)
rare = st.sampled_from([False] * 11 + [True])


@st.composite
def tier_copies(draw: st.DrawFn, tiers: tuple[TierRef, ...]) -> dict[str, TierCopy]:
    if draw(st.booleans()):
        # As the lifecycle leaves them: copies on a prefix of the tiers.
        reached = draw(st.integers(0, len(tiers)))
        return {t.name: draw(copies) for t in tiers[:reached]}
    return {t.name: c for t in tiers if (c := draw(st.none() | copies)) is not None}


@st.composite
def snapshots(draw: st.DrawFn, tiers: tuple[TierRef, ...]) -> RetentionSnapshot:
    steps = sorted(draw(st.lists(st.integers(0, 30), min_size=1, max_size=12, unique=True)))
    ids = draw(st.permutations(range(1, len(steps) + 1)))
    out = [
        CheckpointInfo(
            id=ids[n],
            step=step,
            created_at=T0 + timedelta(minutes=draw(st.integers(0, 3000))),
            total_bytes=100,
            pinned=draw(rare),
            leased=draw(rare),
            quarantined=draw(st.sampled_from([False] * 20 + [True])),
            evidence=draw(st.booleans()),
            tags=draw(st.sampled_from([frozenset(), frozenset(), frozenset({"best"})])),
            # A run's timeline: superseded by a rollback, marked good, needed by a forked job.
            superseded=draw(rare),
            good=draw(st.sampled_from([False, False, True])),
            child_needs=draw(rare),
            copies={
                t.name: c
                for t in tiers
                if (
                    c := draw(
                        st.sampled_from([None, 1, 1, 1]).flatmap(
                            lambda x: copies if x else st.none()
                        )
                    )
                )
                is not None
            },
        )
        for n, step in enumerate(steps)
    ]
    # Histories are mostly registered in step order, sometimes not.
    if draw(st.booleans()):
        out.sort(key=lambda c: c.created_at)
    return RetentionSnapshot(job="job", tiers=tiers, checkpoints=tuple(out))


@st.composite
def cases(draw: st.DrawFn) -> tuple[RetentionSnapshot, Policy, datetime]:
    tiers = draw(tier_lists)
    return (
        draw(snapshots(tiers)),
        draw(policies(tiers)),
        T0 + timedelta(minutes=draw(st.integers(0, 4000))),
    )


def _coverage_events(p: RetentionPlan) -> None:
    """What the examples exercised (pytest --hypothesis-show-statistics)."""
    event(f"expiries: {min(len(p.expiries), 5)}")
    for rule in sorted({e.rule for e in p.expiries}):
        event(f"expiry rule {rule}")
    for reason in sorted({r for k in p.keeps for r in k.reasons}):
        event(f"keep reason {reason}")
    if any(u.quota_met is False for u in p.usage):
        event("quota unmet")


@SETTINGS
@given(cases(), st.randoms(use_true_random=False))
def test_no_plan_breaks_a_safety_rule_and_plans_are_deterministic(
    case: tuple[RetentionSnapshot, Policy, datetime], rnd: random.Random
) -> None:
    snap, policy, now = case
    p = plan(snap, policy, now)
    check_plan(snap, policy, now, p)
    _coverage_events(p)

    shuffled = list(snap.checkpoints)
    rnd.shuffle(shuffled)
    again = plan(snap.model_copy(update={"checkpoints": tuple(shuffled)}), policy, now)
    assert again == p
    assert again.model_dump_json() == p.model_dump_json()
    assert type(p).model_validate_json(p.model_dump_json()) == p

    after = apply(snap, p)
    replan = plan(after, policy, now)
    check_plan(after, policy, now, replan)
    # Without quotas, expiries only ever let more copies be kept by the rules (fewer newer copies
    # to count, a bucket's first copy gone), so a replan expires more only where this plan let a
    # slower tier's copy go and a local copy stops awaiting it ("a tier that received it and
    # expired it again no longer counts"). A quota may also withdraw the tier that kept a
    # checkpoint. Either way every round is safe and the rounds settle.
    quotas = any(u.max_bytes is not None for u in p.usage)
    first = {(e.checkpoint_id, e.tier) for e in p.expiries}
    names = [t.name for t in snap.tiers]
    for e in replan.expiries:
        i = names.index(e.tier)
        released = snap.tiers[i].kind is TierKind.LOCAL and any(
            (e.checkpoint_id, t) in first for t in names[i + 1 :]
        )
        event("replan: " + ("released by a slower expiry" if released else f"quota, {e.rule}"))
        assert released or quotas, (e, p.expiries)
    event(f"quotas: {quotas}, replan expiries: {min(len(replan.expiries), 2)}")
    rounds, current, latest = 1, after, replan
    while latest.expiries:
        current = apply(current, latest)
        latest = plan(current, policy, now)
        check_plan(current, policy, now, latest)
        rounds += 1
        assert rounds <= len(snap.tiers) + 1 or quotas, "plans without quotas settle"
        assert rounds <= 50, "plans with quotas settle"


@settings(
    max_examples=max(1, EXAMPLES // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    tier_lists.flatmap(lambda tiers: st.tuples(st.just(tiers), policies(tiers))),
    st.lists(st.integers(0, 40), min_size=1, max_size=14, unique=True),
    st.data(),
)
def test_histories_replayed_step_by_step_stay_safe(
    tiers_policy: tuple[tuple[TierRef, ...], Policy], steps: list[int], data: st.DataObject
) -> None:
    """The lifecycle's view: checkpoints arrive in step order, copies go pending then restorable
    (or fail), some are pinned; retention runs at every change."""
    tiers, policy = tiers_policy
    steps = sorted(steps)
    pinned = data.draw(st.frozensets(st.sampled_from(steps), max_size=2))
    fails = data.draw(
        st.dictionaries(
            st.sampled_from(steps), st.sampled_from([t.name for t in tiers]), max_size=3
        )
    )
    final = run_history(policy, steps, tiers=tiers, check=check_plan, pinned=pinned, fails=fails)
    durable = tiers[-1].name
    on_durable = [
        c.step
        for c in final.checkpoints
        if durable in c.copies and c.copies[durable].state == TierState.RESTORABLE
    ]
    # Restorable on the durable tier at some point: the copy did not fail (an expired one was
    # restorable before it expired).
    ever = [
        c.step
        for c in final.checkpoints
        if durable in c.copies and c.copies[durable].state != TierState.FAILED
    ]
    event(f"ever restorable on the durable tier: {min(len(ever), 3)}")
    # Whatever the rules, the newest checkpoint that became restorable on the durable tier stays
    # there; and none stays there when none arrived.
    assert max(on_durable, default=None) == max(ever, default=None), (on_durable, ever)
    event(f"pinned: {len(pinned)}")
    for c in final.checkpoints:
        if c.step in pinned:
            assert all(cp.state != TierState.EXPIRED for cp in c.copies.values())


@SETTINGS
@given(
    tier_lists.flatmap(lambda tiers: st.tuples(st.just(tiers), policies(tiers))),
    st.integers(0, 60),
)
def test_the_product_applies_the_rules_as_the_docs_state_them(
    tiers_policy: tuple[tuple[TierRef, ...], Policy], step: int
) -> None:
    """The product's rule lookup and promotion targets agree with the restatement the checker
    uses, so the checker's verdicts are about the rules as documented."""
    tiers, policy = tiers_policy
    assert promotion_targets(policy, tiers, step) == targets(policy, tiers, step)
    for i, rule in enumerate(policy.rules(tiers)):
        stated = rule_of(policy, tiers, i)
        assert rule.has_keep_rules() is not keeps_everything(stated)
        if stated is not None:
            assert rule is stated
    assert {str(r) for r in PROTECTIONS} == STATED_PROTECTIONS
