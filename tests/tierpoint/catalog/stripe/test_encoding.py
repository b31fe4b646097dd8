"""What the encoder, the data endpoint and retention read of the stripe table on a shards' node
(catalog/stripe/encoding.py), on a real catalog: the names its staging area may hold, the size a
staged stripe is served at while it is placed (and not once it is lost or expiring), and what an
expiry or an unstage may delete there."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, names, placed
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.encoding import staged_copies, staged_names, staged_size
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.storage.base import RecordedCopy


def test_a_nodes_staged_stripes_as_the_catalog_places_them(session: Session) -> None:
    cp, (first, second), holders = checkpoint(session, 2)
    job, source = names(session, cp)
    stripes.place(session, cp, TIER, str(CODE), placed(first, holders))

    assert staged_names(session, source, TIER, job) == {(i, "1", "f0") for i in range(6)}
    assert staged_size(session, source, TIER, 1, job, 1, 1, "f0") == 101
    # Not placed, not this node's shard, another branch: nothing is served.
    assert staged_size(session, source, TIER, 1, job, 1, 1, "f1") is None
    assert staged_size(session, holders[0], TIER, 1, job, 1, 1, "f0") is None
    assert staged_size(session, source, TIER, 1, job, 1, 2, "f0") is None
    assert staged_copies(session, cp, TIER, source) == {
        i: [RecordedCopy("f0", 100 + i, f"{i:08x}")] for i in range(CODE.width)
    }
    assert staged_copies(session, cp, TIER, source, [second]) == {}

    # Its holder lost: a stripe that nobody will pull any more is not served.
    mark_lost(session, holders[1], ["ssd"], "test")
    assert staged_size(session, source, TIER, 1, job, 1, 1, "f0") is None
    assert staged_size(session, source, TIER, 0, job, 1, 1, "f0") == 100
    stripes.expire(session, stripes.Move.EXPIRY_BEGUN, [(cp, TIER)])
    assert staged_size(session, source, TIER, 0, job, 1, 1, "f0") is None
    stripes.expire(session, stripes.Move.EXPIRED, [(cp, TIER)])
    assert staged_names(session, source, TIER, job) == set()
