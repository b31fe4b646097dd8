"""The start-up check of coded peer tiers (`code = "rs(k,m)"`), one statement for the API and the
shared worker: a code the cluster cannot place is refused with what it needs."""

from __future__ import annotations

from tierpoint_client.erasure import Code

from tierpoint.config import Settings


def nodes_needed(code: Code) -> int:
    """The fewest nodes that can hold a coded tier: a node's k+m stripes on k+m others."""
    return code.width + 1


def unplaceable(tier: str, code: Code, known_nodes: int) -> str | None:
    """Why a coded tier cannot be placed on a cluster of `known_nodes` nodes, or None. A catalog
    that knows no node yet (a fresh cluster) cannot be judged: None."""
    if known_nodes == 0 or known_nodes >= nodes_needed(code):
        return None
    return (
        f"peer tier {tier!r} keeps {code}: each node's {code.width} stripes go to {code.width} "
        f"other nodes, so it needs at least {nodes_needed(code)} nodes, and the catalog knows "
        f"{known_nodes}. Use a narrower code (k+m at most {max(known_nodes - 1, 0)}), copies, "
        "or start this process once every node's worker has reported in"
    )


def refusal(settings: Settings, known_nodes: int) -> str | None:
    """Why this process must not start with these settings' coded tiers, or None."""
    for tier in settings.peer_tiers():
        code = tier.stripe_code
        if code is None:
            continue
        # guard: code-refused-at-start
        if (problem := unplaceable(tier.name, code, known_nodes)) is not None:
            return problem
    return None


def coded(settings: Settings) -> bool:
    """Whether any peer tier keeps stripes: only then does the check need the catalog."""
    return any(t.stripe_code for t in settings.peer_tiers())


def check(settings: Settings, known_nodes: int) -> None:
    """ValueError with `refusal`'s reason (`known_nodes`: `registry.known_count`)."""
    if (why := refusal(settings, known_nodes)) is not None:
        raise ValueError(why)
