"""What a rebuild reads of a coded copy (catalog/stripe/rebuilding.py) on a real catalog: each
shard's set as it stands, without its expiring or expired stripes, and what each file must
decode to."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, placed, read_back_all, tier_copy
from tierpoint.catalog.models import Shard
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe import rebuilding


def test_a_sets_members_and_its_files_registered_bytes(session: Session) -> None:
    cp, (first, second), holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in (first, second):
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, [first])
    stripes.lose_on_node(session, holders[5], "node lost")
    session.execute(update(Shard).where(Shard.id == first).values(checksum="0000abcd"))

    assert rebuilding.copy_state(session, cp, TIER) == "pending"
    sets = {s.shard_id: s for s in rebuilding.stripe_sets(session, cp, TIER)}
    assert [(m.index, m.node, m.state) for m in sets[first].members] == [
        *((i, holders[i], "verified") for i in range(5)),
        (5, holders[5], "lost"),
    ]
    assert {m.state for m in sets[second].members} == {"pending", "lost"}
    assert (sets[first].ordinal, sets[second].ordinal) == (0, 1)
    # A shard with no crc32c yet has nothing to check a decode against: left out.
    assert rebuilding.files(session, [first, second]) == {first: rebuilding.File(1, "0000abcd")}

    stripes.expire(session, stripes.Move.EXPIRY_BEGUN, [(cp, TIER)])
    assert rebuilding.stripe_sets(session, cp, TIER) == []
