"""Damage on a real catalog: replicas marked bad take their tier copy out of restorable in the same
transaction, and only once."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.catalog_rows import replica_ids, tier_copy_states, verified_everywhere
from tests.helpers.lifecycle import new_job
from tierpoint.catalog.models import (
    Event,
    Replica,
    TierCopy,
)
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.config import Settings
from tierpoint.states import ReplicaState


def test_marking_bad_demotes_in_the_same_transaction_and_only_once(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = verified_everywhere(settings, sessions, new_job(), 1)
    cp = seeded.checkpoint_id
    first, second = replica_ids(sessions, cp, "s3")[:2]
    with sessions.begin() as s:
        damage = mark_damaged(
            s, {first: "scrub: crc32c differs", second: "scrub: short"}, ReplicaState.CORRUPT, "t"
        )
        # Before commit the marker is already demoted in this transaction.
        assert (
            s.scalar(
                select(TierCopy.state).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "s3")
            )
            == "failed"
        )
    assert damage.marked == 2 and damage.demoted == {cp: ["s3"]} and damage.checkpoints == {cp}
    assert tier_copy_states(sessions, cp) == {
        "ssd": "restorable",
        "lustre": "restorable",
        "s3": "failed",
    }
    with sessions.begin() as s:
        reason = s.scalar(
            select(TierCopy.reason).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "s3")
        )
        events = s.execute(
            select(Event.kind, Event.tier, Event.detail).where(Event.checkpoint_id == cp)
        ).all()
    assert reason is not None and "2 shard(s) corrupt on s3 (found by t)" in reason
    assert seeded.shards[0].path in reason
    assert [(k, t, d["count"], d["marker_demoted"]) for k, t, d in events] == [
        ("corrupt", "s3", 2, True)
    ]

    # Again: nothing new (already corrupt), and `lost` on a corrupt replica changes nothing.
    with sessions.begin() as s:
        again = mark_damaged(s, {first: "again"}, ReplicaState.CORRUPT, "t")
        lost = mark_damaged(s, {second: "gone"}, ReplicaState.LOST, "t")
    assert again.marked == lost.marked == 0
    with sessions.begin() as s:
        assert len(s.execute(select(Event.id).where(Event.checkpoint_id == cp)).all()) == 1

    # A replica being expired is retention's: never marked.
    lustre = replica_ids(sessions, cp, "lustre")[0]
    with sessions.begin() as s:
        s.execute(update(Replica).where(Replica.id == lustre).values(state="expiring"))
        assert mark_damaged(s, {lustre: "x"}, ReplicaState.LOST, "t").marked == 0
