from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.helpers.planner_builders import T0, TIERS, checkpoint, good, snapshot
from tierpoint.config import Settings
from tierpoint.retention import (
    DEFAULT_POLICY,
    KeepEvery,
    Policy,
    TierRef,
    TierRule,
    check_tiers,
    plan,
    promotion_targets,
    tier_refs,
)
from tierpoint.retention.policy import format_duration, parse_duration
from tierpoint.tier_config import TierConfig, TierKind


def test_issue_policy_document_round_trips() -> None:
    doc = {
        "tiers": {
            "ssd": {"keep_last": 2},
            "lustre": {"keep_last": 4},
            "s3": {"promote_every": 3, "keep_every": 6},
        }
    }
    policy = Policy.from_spec(doc)
    assert policy.tiers["s3"].keep_every == KeepEvery(steps=6)
    spec = policy.to_spec()
    assert spec == {
        "format": 1,
        "tiers": {
            "ssd": {"keep_last": 2},
            "lustre": {"keep_last": 4},
            "s3": {"keep_every": {"steps": 6}, "promote_every": 3},
        },
    }
    assert Policy.from_spec(json.loads(json.dumps(spec))) == policy


def test_durations_and_shorthands() -> None:
    rule = TierRule.model_validate(
        {"keep_every": "1d", "keep_within": "1d12h", "keep_tags": ["best", "keep", "best"]}
    )
    assert rule.keep_every == KeepEvery(interval=timedelta(days=1))
    assert rule.keep_within == timedelta(hours=36)
    assert rule.keep_tags == ("best", "keep")
    assert rule.model_dump(mode="json", exclude_defaults=True) == {
        "keep_every": {"interval": "1d"},
        "keep_within": "1d12h",
        "keep_tags": ["best", "keep"],
    }
    assert parse_duration("2w") == timedelta(days=14)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert format_duration(timedelta(minutes=90)) == "1h30m"


@given(st.integers(min_value=1, max_value=10**9))
def test_duration_text_round_trips(seconds: int) -> None:
    d = timedelta(seconds=seconds)
    assert parse_duration(format_duration(d)) == d


@pytest.mark.parametrize(
    ("doc", "loc"),
    [
        ({"tiers": {"s3": {"keep_last": -1}}}, ("tiers", "s3", "keep_last")),
        ({"tiers": {"s3": {"keep_lst": 2}}}, ("tiers", "s3", "keep_lst")),
        ({"tiers": {"s3": {"keep_within": "7 days"}}}, ("tiers", "s3", "keep_within")),
        ({"tiers": {"s3": {"keep_within": "0d"}}}, ("tiers", "s3", "keep_within")),
        ({"tiers": {"s3": {"keep_every": {}}}}, ("tiers", "s3", "keep_every")),
        ({"tiers": {"s3": {"keep_every": 0}}}, ("tiers", "s3", "keep_every", "steps")),
        ({"tiers": {"s3": {"keep_every": True}}}, ("tiers", "s3", "keep_every")),
        ({"tiers": {"s3": {"promote_every": 0}}}, ("tiers", "s3", "promote_every")),
        ({"tiers": {"s3": {"max_bytes": -5}}}, ("tiers", "s3", "max_bytes")),
        ({"tiers": {"s3": {"keep_tags": [""]}}}, ("tiers", "s3", "keep_tags")),
        ({"tiers": {"../x": {}}}, ("tiers",)),
        ({"kinds": {"tape": {}}}, ("kinds", "tape", "[key]")),
        ({"kinds": {"local": {"promote_every": 2}}}, ("kinds",)),
        ({"format": 2}, ("format",)),
        ({"durable": {"keep_last": "many"}}, ("durable", "keep_last")),
        ({"retention": {}}, ("retention",)),
    ],
)
def test_invalid_policies_name_the_field(doc: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        Policy.from_spec(doc)
    locs = [tuple(str(p) for p in e["loc"]) for e in info.value.errors()]
    assert any(found[: len(loc)] == loc for found in locs), locs


def test_rule_lookup_order() -> None:
    named = TierRule(keep_last=1)
    durable = TierRule(keep_last=7)
    shared = TierRule(keep_last=3)
    policy = Policy(tiers={"lustre": named}, durable=durable, kinds={TierKind.SHARED: shared})
    assert policy.rule_for("lustre", TierKind.SHARED, most_durable=True) is named
    assert policy.rule_for("nfs", TierKind.SHARED, most_durable=True) is durable
    assert policy.rule_for("nfs", TierKind.SHARED, most_durable=False) is shared
    assert not policy.rule_for("ssd", TierKind.LOCAL, most_durable=False).has_keep_rules()


def test_default_policy_keeps_everything_on_the_most_durable_tier() -> None:
    assert Policy.from_spec(DEFAULT_POLICY.to_spec()) == DEFAULT_POLICY
    two = (TierRef("ssd", TierKind.LOCAL), TierRef("nfs", TierKind.SHARED))
    rules = [DEFAULT_POLICY.rule_for(t.name, t.kind, most_durable=t == two[-1]) for t in two]
    assert rules[0].keep_last == 2
    assert not rules[1].has_keep_rules()
    three = [DEFAULT_POLICY.rule_for(t.name, t.kind, most_durable=t == TIERS[-1]) for t in TIERS]
    assert [r.keep_last for r in three] == [2, 4, None]
    assert not three[2].has_keep_rules()


def test_promotion_targets_by_step_multiple() -> None:
    policy = Policy.from_spec({"tiers": {"s3": {"promote_every": 3}}})
    sent = {step: promotion_targets(policy, TIERS, step) for step in range(1, 13)}
    assert [s for s, tiers in sent.items() if "s3" in tiers] == [3, 6, 9, 12]
    assert all(tiers[:2] == ["ssd", "lustre"] for tiers in sent.values())
    assert promotion_targets(policy, TIERS, 0) == ["ssd", "lustre", "s3"]
    # The first tier is always a target, even if a rule for it says otherwise.
    odd = Policy.from_spec({"tiers": {"ssd": {"promote_every": 5}}})
    assert promotion_targets(odd, TIERS, 1) == ["ssd", "lustre", "s3"]


def test_check_tiers_reports_unknown_tiers_and_promote_every_on_the_first() -> None:
    policy = Policy.from_spec({"tiers": {"tape": {}, "ssd": {"promote_every": 2}, "s3": {}}})
    problems = check_tiers(policy, TIERS)
    assert [(p.loc, "tape" in p.msg or "first" in p.msg) for p in problems] == [
        (("tiers", "tape"), True),
        (("tiers", "ssd", "promote_every"), True),
    ]
    assert check_tiers(DEFAULT_POLICY, TIERS) == []


def test_tier_refs_from_settings_tiers() -> None:
    cfgs = [
        TierConfig(name="ram", kind=TierKind.LOCAL, root="/dev/shm/{node}"),
        TierConfig(name="s3", kind=TierKind.S3, bucket="b"),
    ]
    assert tier_refs(cfgs) == (TierRef("ram", TierKind.LOCAL), TierRef("s3", TierKind.S3))


def test_json_schema_describes_durations_as_strings() -> None:
    schema = Policy.model_json_schema()
    rule = schema["$defs"]["TierRule"]["properties"]["keep_within"]
    assert any(alt.get("type") == "string" for alt in rule["anyOf"])


def test_every_policy_in_the_docs_validates() -> None:
    text = (Path(__file__).parents[3] / "docs" / "retention.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    policies = [json.loads(b) for b in blocks if '"expiries"' not in b]
    assert len(policies) >= 6
    for doc in policies:
        assert check_tiers(Policy.from_spec(doc), TIERS) == [], doc


def test_a_rule_for_a_peer_tier_applies_to_its_copies() -> None:
    """`tiers.peer` rules `peer.2`, the second copy of a peer tier with `copies = 2`, unless
    `peer.2` has a rule of its own: without it the second copy would keep every checkpoint and
    fill its holders' disks."""
    refs = tier_refs(
        Settings(
            tiers=[
                {"name": "ssd", "kind": "local", "root": "/nvme/{node}/ssd"},
                {"name": "peer", "kind": "peer", "root": "/nvme/{node}/peer", "copies": 2},
                {"name": "s3", "kind": "s3", "bucket": "b"},
            ]
        ).tiers
    )
    assert [r.name for r in refs] == ["ssd", "peer", "peer.2", "s3"]
    policy = Policy.from_spec({"tiers": {"peer": {"keep_last": 1}}})
    # A rule naming a copy is one for a configured tier.
    assert check_tiers(policy, refs) == []
    assert check_tiers(Policy.from_spec({"tiers": {"peer.2": {}}}), refs) == []
    assert policy.rule_for("peer.2", TierKind.PEER, most_durable=False).keep_last == 1
    # The planner expires the second copy's older checkpoint as it does the first's.
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "peer": good(), "peer.2": good(), "s3": good()}),
        checkpoint(2, {"ssd": good(), "peer": good(), "peer.2": good(), "s3": good()}),
        tiers=refs,
    )
    expired = {(e.step, e.tier) for e in plan(snap, policy, T0 + timedelta(days=1)).expiries}
    assert expired == {(1, "peer"), (1, "peer.2")}
    # A copy's own rule wins; the fallback is for peer tiers only, and needs the tier's rule.
    own = Policy.from_spec({"tiers": {"peer": {"keep_last": 1}, "peer.2": {"keep_last": 3}}})
    assert own.rule_for("peer.2", TierKind.PEER, most_durable=False).keep_last == 3
    assert not policy.rule_for("peer.2", TierKind.SHARED, most_durable=False).has_keep_rules()
    assert not policy.rule_for("peer.1", TierKind.PEER, most_durable=False).has_keep_rules()
    assert not policy.rule_for("other.2", TierKind.PEER, most_durable=False).has_keep_rules()


PEER_STACK = (
    TierRef("ram", TierKind.LOCAL),
    TierRef("ssd", TierKind.LOCAL),
    TierRef("peer", TierKind.PEER),
    TierRef("peer.2", TierKind.PEER),
    TierRef("s3", TierKind.S3),
)


def test_the_built_in_policy_keeps_the_newest_two_on_peer_tiers() -> None:
    rules = DEFAULT_POLICY.rules(PEER_STACK)
    assert [r.keep_last for r in rules] == [2, 2, 2, 2, None]
    assert not rules[-1].has_keep_rules()
    assert DEFAULT_POLICY.inherited(PEER_STACK) == {}


def test_a_peer_tier_without_a_rule_keeps_what_the_local_tier_it_copies_keeps() -> None:
    """A policy written with rules for the local tier only: its peer tiers (the copies of that
    tier's bytes on other nodes) keep what that tier keeps, not everything forever."""
    ssd = TierRule(keep_last=1, max_bytes=10)
    policy = Policy(tiers={"ssd": ssd}, kinds={TierKind.LOCAL: TierRule(keep_last=5)})
    rules = policy.rules(PEER_STACK)
    assert rules[2] is ssd and rules[3] is ssd
    assert policy.inherited(PEER_STACK) == {"peer": "ssd", "peer.2": "ssd"}
    assert rules[0].keep_last == 5 and not rules[4].has_keep_rules()
    # The policy's own word wins: a kind rule (even one keeping everything), a rule by name (the
    # second copy takes the first's), the durable rule of a peer tier that is the last tier.
    for spec, tiers, want in (
        ({"kinds": {"local": {"keep_last": 1}, "peer": {}}}, PEER_STACK, None),
        (
            {"kinds": {"local": {"keep_last": 1}}, "tiers": {"peer": {"keep_last": 3}}},
            PEER_STACK,
            3,
        ),
        ({"kinds": {"local": {"keep_last": 1}}, "durable": {"keep_last": 4}}, PEER_STACK[:3], 4),
    ):
        other = Policy.from_spec(spec)
        assert other.rules(tiers)[2].keep_last == want, spec
        assert "peer" not in other.inherited(tiers), spec
    # promote_every follows too: the peer tier receives what its local tier receives.
    assert promotion_targets(policy, PEER_STACK, 3) == ["ram", "ssd", "peer", "peer.2", "s3"]


def test_the_dry_run_says_which_peer_tiers_keep_the_local_tiers_rule() -> None:
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 1}}})
    snap = snapshot(
        checkpoint(1, {"ssd": good(), "peer": good(), "s3": good()}),
        tiers=(
            TierRef("ssd", TierKind.LOCAL),
            TierRef("peer", TierKind.PEER),
            TierRef("s3", TierKind.S3),
        ),
    )
    notes = plan(snap, policy, T0).notes
    assert notes == (
        "peer tier 'peer' has no rule in this policy: it keeps what 'ssd' keeps (keep_last=1); "
        "give it one under tiers or kinds.peer to change that",
    )
    assert plan(snap, DEFAULT_POLICY, T0).notes == ()
