"""Peer placement (activities/placement.py): the ring over the live nodes, against an independent
statement of its promises: never the node itself, K distances on K distinct nodes while the ring
is longer than K, every live node holding about as many copies as any other, deterministic; with
failure domains, K copies in K distinct domains other than the source's whenever there are that
many, and never fewer copies than without domains; a coded tier's stripe set on k+m distinct
nodes and domains by the same list, or not at all. And the peer tier's configuration rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tierpoint_client.erasure import Code

from activities.placement import assign, holders_by_tier, place, ring_holders, stripe_holders
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

NODE = st.from_regex(r"node-[a-z0-9]{1,4}", fullmatch=True)


@given(
    live=st.lists(NODE, min_size=1, max_size=12, unique=True),
    gone=st.lists(NODE, max_size=3, unique=True),
    k=st.integers(1, 4),
)
def test_copies_go_to_k_distinct_other_live_nodes(live: list[str], gone: list[str], k: int) -> None:
    sources = sorted(set(live) | set(gone))
    per_distance = [ring_holders(sources, live, d) for d in range(1, k + 1)]
    for node in sources:
        held = [p[node] for p in per_distance if node in p]
        assert node not in held
        assert all(h in live for h in held)
        assert len(set(held)) == len(held)
        others = len(set(live) - {node})
        # Every distance places a copy while the ring has room for one.
        assert len(held) == min(k, others if node in live else len(live))
    # The same inputs, in any order, give the same holders.
    assert per_distance[0] == ring_holders(list(reversed(sources)), list(reversed(live)), 1)


@given(live=st.lists(NODE, min_size=2, max_size=12, unique=True), distance=st.integers(1, 3))
def test_every_live_node_holds_one_nodes_copies(live: list[str], distance: int) -> None:
    holders = ring_holders(live, live, distance)
    if distance >= len(live):
        assert holders == {}
        return
    # A permutation of the live nodes: each holds exactly one other node's copies.
    assert Counter(holders.values()) == Counter(live)


DOMAIN = st.one_of(st.none(), st.sampled_from(["rack-1", "rack-2", "rack-3", "rack-4"]))


@given(
    labelled=st.dictionaries(NODE, DOMAIN, min_size=1, max_size=12),
    gone=st.dictionaries(NODE, DOMAIN, max_size=3),
    k=st.integers(1, 5),
)
def test_copies_spread_over_failure_domains_when_they_can(
    labelled: dict[str, str | None], gone: dict[str, str | None], k: int
) -> None:
    domains = {**gone, **labelled}
    live = sorted(labelled)
    sources = sorted(domains)
    placed = place(sources, live, k, domains)

    def domain(n: str) -> str:
        label = domains.get(n)
        return f"d:{label}" if label else f"n:{n}"

    for node in sources:
        held = placed[node]
        assert node not in held and len(set(held)) == len(held)
        assert set(held) <= set(live)
        others = [n for n in live if n != node]
        # Domains never cost a copy: as many as the ring has room for.
        assert len(held) == min(k, len(others))
        # Each distance is one copy: the k copies are the first k of k+1.
        assert held == place([node], live, k + 1, domains)[node][:k]
        free = {domain(n) for n in others} - {domain(node)}
        if len(free) >= len(held):
            # Enough domains: every copy in its own, none in the source's.
            assert len({domain(h) for h in held}) == len(held), (node, held)
            assert domain(node) not in {domain(h) for h in held}, (node, held)
        for i, h in enumerate(held):
            assert ring_holders([node], live, i + 1, domains) == {node: h}
    # Deterministic: the same nodes and labels in any order give the same holders.
    assert place(reversed(sources), list(reversed(live)), k, dict(reversed(domains.items()))) == (
        placed
    )


@given(
    labelled=st.dictionaries(NODE, DOMAIN, min_size=1, max_size=12),
    gone=st.dictionaries(NODE, DOMAIN, max_size=3),
    k=st.integers(1, 5),
)
def test_a_fresh_placement_gives_the_i_th_tier_the_i_th_holder(
    labelled: dict[str, str | None], gone: dict[str, str | None], k: int
) -> None:
    """With no copies kept, `assign` places the K tiers exactly as the ring's distances do."""
    domains = {**gone, **labelled}
    live = sorted(labelled)
    tiers = [f"peer.{i}" for i in range(1, k + 1)]
    by_tier = holders_by_tier(domains, live, tiers, domains)
    for i, tier in enumerate(tiers):
        assert by_tier[tier] == ring_holders(domains, live, i + 1, domains)


@given(
    labelled=st.dictionaries(NODE, DOMAIN, min_size=1, max_size=10),
    data=st.data(),
)
def test_a_copy_made_again_never_goes_beside_another_copy(
    labelled: dict[str, str | None], data: st.DataObject
) -> None:
    """Some of a node's K copies are kept on live nodes (placed on an earlier ring), the others
    are made again: each new one on a live node that holds none of its other copies, in a domain
    none of them (nor the node) is in whenever a free node has one; left out only when no live
    node is free of them."""
    live = sorted(labelled)
    node = data.draw(st.sampled_from(live) | NODE, label="node")
    domains = {node: data.draw(DOMAIN, label="own domain"), **labelled}
    k = data.draw(st.integers(1, 4), label="k")
    tiers = [f"peer.{i}" for i in range(1, k + 1)]
    others = [n for n in live if n != node]
    # Kept copies sit on distinct nodes, as placement put them.
    kept: dict[str, set[str]] = {}
    spare = list(others)
    for t in tiers:
        keep = data.draw(st.booleans(), label=f"{t} kept")
        if spare and keep:
            holder = data.draw(st.sampled_from(spare), label=f"{t} holder")
            kept[t] = {holder}
            spare.remove(holder)
    remade = [t for t in tiers if t not in kept]
    given = assign(node, live, remade, domains, kept)

    def domain(n: str) -> str:
        label = domains.get(n)
        return f"d:{label}" if label else f"n:{n}"

    taken = set().union(*kept.values())
    for tier in remade:
        if tier not in given:
            free = set(others) - taken - set(given.values())
            assert not free, (tier, free)
            continue
        holder = given[tier]
        assert holder in live and holder != node and holder not in taken
        used = {domain(node)} | {domain(h) for h in taken}
        if any(domain(n) not in used for n in set(others) - taken):
            assert domain(holder) not in used, (holder, taken)
        taken.add(holder)


def test_a_rack_keeps_no_two_copies() -> None:
    live = ["n1", "n2", "n3", "n4", "n5", "n6"]
    racks = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2", "n5": "r3", "n6": "r3"}
    # n1's next nodes are n2 (its own rack), n3 (r2), n4 (r2 again), n5 (r3).
    assert place(["n1"], live, 2, racks) == {"n1": ["n3", "n5"]}
    # No third rack besides its own: the third copy goes outside n1's rack before inside it.
    assert place(["n1"], live, 4, racks) == {"n1": ["n3", "n5", "n4", "n6"]}
    assert place(["n1"], live, 5, racks) == {"n1": ["n3", "n5", "n4", "n6", "n2"]}
    # Without labels, the ring: the i-th copy on the i-th node after n1.
    assert place(["n1"], live, 2) == {"n1": ["n2", "n3"]}


def test_the_ring_is_the_sorted_live_nodes() -> None:
    live = ["node-c", "node-a", "node-b"]
    assert ring_holders(live, live, 1) == {
        "node-a": "node-b",
        "node-b": "node-c",
        "node-c": "node-a",
    }
    assert ring_holders(live, live, 2) == {
        "node-a": "node-c",
        "node-b": "node-a",
        "node-c": "node-b",
    }
    # A node that wrote shards but is not live any more: the first live node after it.
    assert ring_holders(["node-bb"], live, 1) == {"node-bb": "node-c"}
    assert ring_holders(["node-a"], ["node-a"], 1) == {}


def test_a_peer_tier_needs_a_local_tier_before_it_and_a_root_per_node() -> None:
    local = TierConfig(name="ssd", kind=TierKind.LOCAL, root="/nvme/{node}")
    peer = TierConfig(name="peer", kind=TierKind.PEER, root="/nvme/peers/{node}")
    with pytest.raises(ValueError, match="needs a local tier before it"):
        Settings(tiers=[peer, local])
    assert Settings(tiers=[local, peer]).peer_tiers() == [peer]
    assert str(peer.root_for("node-b")) == "/nvme/peers/node-b"
    with pytest.raises(ValueError, match="per node"):
        peer.root_for(None)
    with pytest.raises(ValueError, match="needs a root"):
        TierConfig(name="peer", kind=TierKind.PEER)


@given(
    labelled=st.dictionaries(NODE, DOMAIN, min_size=1, max_size=14),
    k=st.integers(2, 6),
    m=st.integers(1, 3),
)
def test_a_stripe_set_spans_k_plus_m_distinct_nodes_and_domains_or_is_not_placed(
    labelled: dict[str, str | None], k: int, m: int
) -> None:
    code = Code(k, m)
    live = sorted(labelled)

    def domain(n: str) -> str:
        return labelled[n] or f"own:{n}"

    for node in live:
        holders = stripe_holders(node, live, code, labelled)
        if len(live) - 1 < code.width:
            # On fewer nodes one loss could take more than m stripes: not placed at all.
            assert holders is None
            continue
        assert holders is not None and len(holders) == code.width
        assert node not in holders and len(set(holders)) == code.width
        # Stripe i is the i-th holder of the node's copies: the one rule for copies and stripes.
        assert holders == place([node], live, code.width, labelled)[node]
        # As many distinct domains other than the node's as the ring offers, up to k+m.
        others = {domain(n) for n in live if domain(n) != domain(node)}
        spread = {domain(h) for h in holders} - {domain(node)}
        assert len(spread) >= min(code.width, len(others))
