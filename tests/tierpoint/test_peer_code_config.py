"""`code = "rs(k,m)"` on a peer tier: read from the keyword arguments, TIERPOINT_TIERS and a dumped
list alike, in one spelling; a bad code, a code beside `copies`, a code on another kind are
refused at start with what is wrong; the placement rule's view of a coded tier."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from tierpoint_client.erasure import Code

from activities.placement import stripe_holders
from tierpoint.config import Settings
from tierpoint.services.coded_tiers import nodes_needed, unplaceable

SSD = {"name": "ssd", "kind": "local", "root": "/nvme/{node}/ssd"}


def _peer(**extra: Any) -> dict[str, Any]:
    return {"name": "peer", "kind": "peer", "root": "/nvme/{node}/peer", **extra}


def test_a_coded_peer_tier_is_one_tier_with_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(tiers=[SSD, _peer(code=" rs( 8, 2 )")])
    (peer,) = settings.peer_tiers()
    assert (peer.name, peer.code, peer.stripe_code, peer.copies) == (
        "peer",
        "rs(8,2)",
        Code(8, 2),
        1,
    )
    dumped = settings.model_dump(mode="json")["tiers"]
    monkeypatch.setenv("TIERPOINT_TIERS", json.dumps(dumped))
    assert Settings().tiers == settings.tiers
    # A peer tier that keeps copies has no code.
    assert Settings(tiers=[SSD, _peer(copies=2)]).peer_tiers()[0].stripe_code is None


@pytest.mark.parametrize(
    ("tier", "says"),
    [
        (_peer(code="rs(1,2)"), "k must be at least 2"),
        (_peer(code="rs(4,0)"), "m must be at least 1"),
        (_peer(code="rs(30,3)"), "k+m must be at most 32"),
        (_peer(code="raid6"), "is not of the form rs(k,m)"),
        (_peer(code="rs(4,2)", copies=2), "copies = 2 or code = 'rs(4,2)', not both"),
        ({**SSD, "name": "ram", "code": "rs(4,2)"}, "code: peer tiers only, 'ram' is local"),
    ],
)
def test_a_bad_code_is_refused_at_start_saying_why(tier: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as e:
        Settings(tiers=[SSD, tier])
    assert says in str(e.value)


def test_a_stripe_set_goes_to_k_plus_m_distinct_nodes_in_distinct_domains() -> None:
    code = Code(4, 2)
    ring = [f"n{i:02d}" for i in range(10)]
    domains = {n: f"rack{i % 7}" for i, n in enumerate(ring)}
    for node in ring:
        holders = stripe_holders(node, ring, code, domains)
        assert holders is not None and len(holders) == code.width
        assert node not in holders and len(set(holders)) == code.width
        # Seven racks: the six holders are in six racks, none of them the node's own.
        assert len({domains[h] for h in holders} | {domains[node]}) == code.width + 1
    # A set is placed whole or not at all.
    assert stripe_holders("n00", ring[: code.width], code) is None
    assert stripe_holders("n00", ring[: code.width + 1], code) == ring[1 : code.width + 1]


def test_a_code_wider_than_the_cluster_is_said_to_be_unplaceable() -> None:
    assert nodes_needed(Code(8, 2)) == 11
    assert unplaceable("peer", Code(8, 2), 11) is None
    problem = unplaceable("peer", Code(8, 2), 10)
    assert problem is not None
    assert "needs at least 11 nodes, and the catalog knows 10" in problem
    assert "k+m at most 9" in problem
    # A catalog that knows no node yet (a fresh cluster) cannot be judged.
    assert unplaceable("peer", Code(8, 2), 0) is None
