"""Where a peer tier keeps each node's copy: a ring over the serving nodes, spread over domains.

The serving nodes (reported in recently, not declared lost), sorted by id, form a ring. Each source
node N has a preference list of holders: walking the ring from N, first the nodes of failure
domains not used yet (never N's own domain), then the other nodes outside N's domain, then the
rest of the ring; never N itself. The i-th peer tier (from 1) places N's copy on the i-th node of
that list. So the rule is deterministic (every planner computes the same holders from the same
nodes and labels), K peer tiers put K copies on K distinct nodes while the ring has more than K
nodes, and in K distinct domains other than N's while there are that many. A node reports its
domain (`failure_domain`, e.g. a rack or zone); a node without one is a domain of its own, so
without labels the i-th holder is simply the i-th node after N, and every serving node holds
about as many copies as it has shards of its own. A node that is not in the ring (it wrote
shards, then stopped reporting in) still gets holders: the walk starts at the first serving node
after it.

A copy made again (re-replication after its holder was lost, a retry) goes to the first node of
that list that holds none of the node's copies on the other peer tiers, the domains of those
counting as used: K copies stay on K distinct nodes (and domains, while there are enough) however
the ring changed since the others were placed. When no such serving node is left the copy is not
made, rather than put beside another copy that one node's loss would take with it (`assign`).

A peer tier that keeps erasure-coded stripes (`code = "rs(k,m)"`) places a node's stripe set by
the same list: stripe i on its i-th node, so the k+m stripes are on k+m distinct nodes, in
distinct domains while there are that many (`stripe_holders`). A set is placed whole or not at
all: on fewer nodes, one node's loss could take more than m of its stripes.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence

from tierpoint_client.erasure import Code


def preference(
    node: str,
    ring: Sequence[str],
    domains: Mapping[str, str | None] | None = None,
    held: Collection[str] = (),
) -> list[str]:
    """Every node of the sorted `ring` but `node`, in the order `node`'s copies go to them; with
    `held` (the nodes holding its other copies), those left out and their domains used."""
    labels = domains or {}

    def domain(n: str) -> str:
        label = labels.get(n)
        return f"domain:{label}" if label else f"node:{n}"

    start = bisect.bisect_right(ring, node)
    # guard: peer-ring-never-self
    walk = [n for n in (*ring[start:], *ring[:start]) if n != node]
    walk = [n for n in walk if n not in held]
    own = domain(node)
    first: list[str] = []
    used = {own, *(domain(h) for h in held)}
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
    serving: Sequence[str],
    copies: int,
    domains: Mapping[str, str | None] | None = None,
) -> dict[str, list[str]]:
    """Each source node's first `copies` holders (fewer while the ring has fewer other nodes)."""
    ring = sorted(set(serving))
    return {n: preference(n, ring, domains)[:copies] for n in sorted(set(sources))}


def ring_holders(
    sources: Iterable[str],
    serving: Sequence[str],
    distance: int,
    domains: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """Each source node's holder for the `distance`-th (>= 1) peer copy; a source with no holder
    other than itself (fewer serving nodes than the distance needs) is left out."""
    placed = place(sources, serving, distance, domains)
    return {n: held[distance - 1] for n, held in placed.items() if len(held) >= distance}


def assign(
    node: str,
    serving: Sequence[str],
    tiers: Sequence[str],
    domains: Mapping[str, str | None] | None = None,
    kept: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """The holder of a new copy of `node`'s shards on each of `tiers` (peer tier names in the
    configuration's order), one tier after the other: the first node of `node`'s preference
    list that holds none of its copies on another tier, neither one `kept` (tier -> the serving
    nodes holding its copies there now) nor one given to a tier before. A tier that finds no
    such node is left out. With nothing kept, tier i gets the i-th node of the list, as `place`
    says."""
    ring = sorted(set(serving))
    held = kept or {}
    given: dict[str, str] = {}
    for tier in tiers:
        others = {h for t, nodes in held.items() if t != tier for h in nodes}
        # guard: rereplication-chooses-distinct-holders
        options = preference(node, ring, domains, others | set(given.values()))
        if options:
            given[tier] = options[0]
    return given


def holders_by_tier(
    sources: Iterable[str],
    serving: Sequence[str],
    tiers: Sequence[str],
    domains: Mapping[str, str | None] | None = None,
    kept: Mapping[str, Mapping[str, Collection[str]]] | None = None,
) -> dict[str, dict[str, str]]:
    """tier -> source node -> the holder `assign` gives its new copy there (`kept`: per source
    node, what `assign` takes); a node with no holder on a tier is left out of that tier's."""
    out: dict[str, dict[str, str]] = {t: {} for t in tiers}
    for n in sorted(set(sources)):
        for tier, holder in assign(n, serving, tiers, domains, (kept or {}).get(n, {})).items():
            out[tier][n] = holder
    return out


def stripe_holders(
    node: str,
    serving: Sequence[str],
    code: Code,
    domains: Mapping[str, str | None] | None = None,
) -> list[str] | None:
    """The holders of `node`'s stripe set, stripe i on the i-th: the first k+m nodes of its
    preference list; None while fewer than k+m other nodes serve."""
    holders = preference(node, sorted(set(serving)), domains)[: code.width]
    # guard: stripe-set-whole
    return holders if len(holders) == code.width else None


def rehome(
    node: str,
    serving: Sequence[str],
    held: Collection[str],
    domains: Mapping[str, str | None] | None = None,
) -> str | None:
    """The new holder of a stripe of `node`'s set whose holder was lost (a rebuild): the first
    node of `node`'s preference list that holds no stripe of the set (`held`: the serving nodes
    that do), their domains counting as used; None when no such serving node is left."""
    # guard: rebuild-never-onto-a-holder-of-the-set
    options = preference(node, sorted(set(serving)), domains, held)
    return options[0] if options else None
