"""The S3 key layout of a checkpoint's copy is recorded once, on a real catalog: a later plan with
another layout in force changes nothing, and a copy begun before layouts were recorded (a replica
exists, the column is null) stays flat, as its objects are."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import NODES, new_job, random_shards, seed_checkpoint
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.models import Replica, Shard
from tierpoint.catalog.tier_copy import key_layouts
from tierpoint.catalog.tier_copy.machine import ensure_tier_copies
from tierpoint.config import Settings
from tierpoint.storage.s3.layout import FLAT, KeyLayout


def _checkpoint(settings: Settings, sessions: sessionmaker[Session]) -> int:
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, random_shards(NODES, 1, 10))
    with sessions.begin() as s:
        head = checkpoint_head(s, seeded.checkpoint_id)
        assert head is not None
        ensure_tier_copies(s, head, ["lustre", "s3"])
    return seeded.checkpoint_id


def _record(sessions: sessionmaker[Session], cid: int, layout: KeyLayout) -> dict[str, KeyLayout]:
    with sessions.begin() as s:
        key_layouts.record(s, cid, {"s3": layout})
    with sessions.begin() as s:
        return key_layouts.of_checkpoint(s, cid)


def test_the_first_recorded_layout_stays(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    cid = _checkpoint(settings, sessions)
    with sessions.begin() as s:
        assert key_layouts.of_checkpoint(s, cid) == {"lustre": FLAT, "s3": FLAT}
    assert _record(sessions, cid, KeyLayout(8))["s3"] == KeyLayout(8)
    # The setting changed, the lifecycle planned again: the copy keeps its keys.
    assert _record(sessions, cid, FLAT)["s3"] == KeyLayout(8)
    assert _record(sessions, cid, KeyLayout(16))["s3"] == KeyLayout(8)
    with sessions.begin() as s:
        assert key_layouts.on_tier(s, [cid, cid + 10**9], "s3") == {cid: KeyLayout(8)}


def test_a_copy_begun_before_layouts_were_recorded_stays_flat(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    cid = _checkpoint(settings, sessions)
    with sessions.begin() as s:
        shard = s.scalar(select(Shard.id).where(Shard.checkpoint_id == cid).limit(1))
        s.execute(
            insert(Replica).values(
                shard_id=shard, checkpoint_id=cid, tier="s3", state="copying", location="x"
            )
        )
    assert _record(sessions, cid, KeyLayout(8))["s3"] == FLAT
