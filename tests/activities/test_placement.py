"""Peer placement (activities/placement.py): the ring over the live nodes, against an independent
statement of its promises: never the node itself, K distances on K distinct nodes while the ring
is longer than K, every live node holding about as many copies as any other, deterministic. And
the peer tier's configuration rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activities.placement import ring_holders
from tierpoint.config import Settings, TierConfig, TierKind

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
