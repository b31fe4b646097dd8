"""What a rebuild reads of a coded copy (catalog/stripe/rebuilding.py) on a real catalog: each
shard's set as it stands, without its expiring or expired stripes, and what each file must
decode to; and which checkpoints have stripes found bad for it to cut again."""

from __future__ import annotations

from sqlalchemy import func, update
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, placed, read_back_all, tier_copy
from tierpoint.catalog.models import Node, Shard
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe import rebuilding
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.states import ReplicaState


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


def test_a_restorable_copy_with_a_stripe_found_bad_on_a_live_holder_is_due(
    session: Session,
) -> None:
    cp, (first, second), holders = checkpoint(session, 2)
    tier_copy(session, cp)
    for shard in (first, second):
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, [first, second])
    assert promote(session, cp, TIER, [], None, CODE).state == "restorable"
    assert rebuilding.due(session, TIER, [cp]) == []

    # A stripe lost with a node declared lost: the declaration asks for that rebuild.
    session.execute(update(Node).where(Node.id == holders[5]).values(lost_at=func.now()))
    stripes.lose_on_node(session, holders[5], "node lost")
    assert rebuilding.due(session, TIER, [cp]) == []
    # One read back bad on its live holder: due; a copy below k is not (nothing to cut from).
    bad = {(first, 0): "crc32c differs"}
    mark_stripes_damaged(session, TIER, CODE, bad, ReplicaState.CORRUPT, "scrub")
    assert rebuilding.due(session, TIER, [cp, cp + 1000]) == [cp]
    worse = {(first, i): "gone" for i in (1, 2)}
    mark_stripes_damaged(session, TIER, CODE, worse, ReplicaState.LOST, "scrub")
    assert rebuilding.copy_state(session, cp, TIER) == "failed"
    assert rebuilding.due(session, TIER, [cp]) == []
