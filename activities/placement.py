"""Where a peer tier keeps each node's copy: a ring over the live nodes, spread over domains.

The live nodes (reported in recently, not declared lost), sorted by id, form a ring. Each source
node N has a preference list of holders: walking the ring from N, first the nodes of failure
domains not used yet (never N's own domain), then the other nodes outside N's domain, then the
rest of the ring; never N itself. The i-th peer tier (from 1) places N's copy on the i-th node of
that list. So the rule is deterministic (every planner computes the same holders from the same
nodes and labels), K peer tiers put K copies on K distinct nodes while the ring has more than K
nodes, and in K distinct domains other than N's while there are that many. A node reports its
domain (`failure_domain`, e.g. a rack or zone); a node without one is a domain of its own, so
without labels the i-th holder is simply the i-th node after N, and every live node holds about as
many copies as it has shards of its own. A node that is not in the ring (it wrote shards, then
stopped reporting in) still gets holders: the walk starts at the first live node after it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence


def preference(
    node: str, ring: Sequence[str], domains: Mapping[str, str | None] | None = None
) -> list[str]:
    """Every node of the sorted `ring` but `node`, in the order `node`'s copies go to them."""
    labels = domains or {}

    def domain(n: str) -> str:
        label = labels.get(n)
        return f"domain:{label}" if label else f"node:{n}"

    start = bisect.bisect_right(ring, node)
    walk = [n for n in (*ring[start:], *ring[:start]) if n != node]
    own = domain(node)
    first: list[str] = []
    used = {own}
    for n in walk:
        if domain(n) not in used:
            used.add(domain(n))
            first.append(n)
    picked = set(first)
    outside = [n for n in walk if n not in picked and domain(n) != own]
    inside = [n for n in walk if n not in picked and domain(n) == own]
    return first + outside + inside


def place(
    sources: Iterable[str],
    live: Sequence[str],
    copies: int,
    domains: Mapping[str, str | None] | None = None,
) -> dict[str, list[str]]:
    """Each source node's first `copies` holders (fewer while the ring has fewer other nodes)."""
    ring = sorted(set(live))
    return {n: preference(n, ring, domains)[:copies] for n in sorted(set(sources))}


def ring_holders(
    sources: Iterable[str],
    live: Sequence[str],
    distance: int,
    domains: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """Each source node's holder for the `distance`-th (>= 1) peer copy; a source with no holder
    other than itself (fewer live nodes than the distance needs) is left out."""
    placed = place(sources, live, distance, domains)
    return {n: held[distance - 1] for n, held in placed.items() if len(held) >= distance}
