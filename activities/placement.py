"""Where a peer tier keeps each node's copy: a ring over the live nodes.

The live nodes (reported in recently, not declared lost), sorted by id, form a ring; the i-th
peer tier (from 1) places node N's copy on the i-th node after N. So the rule is deterministic
(every planner computes the same holders from the same nodes), a node never holds its own copy,
K peer tiers put K copies on K distinct nodes while the ring has more than K nodes, and every
live node holds about as many copies as it has shards of its own. A node that is not in the ring
(it wrote shards, then stopped reporting in) still gets a holder: the first live node after it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


def ring_holders(sources: Iterable[str], live: Sequence[str], distance: int) -> dict[str, str]:
    """Each source node's holder at `distance` (>= 1) along the ring of `live`; a source with no
    holder other than itself (fewer live nodes than the distance needs) is left out."""
    ring = sorted(set(live))
    out: dict[str, str] = {}
    for node in sorted(set(sources)):
        if node in ring:
            if distance >= len(ring):
                continue
            out[node] = ring[(ring.index(node) + distance) % len(ring)]
        elif len(ring) >= distance:
            start = bisect.bisect_right(ring, node)
            out[node] = ring[(start + distance - 1) % len(ring)]
    return out
