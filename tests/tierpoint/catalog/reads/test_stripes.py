"""A coded copy's stripes shard by shard (catalog/reads/stripes.py), on a real catalog: shards in
manifest order a page at a time, each with its stripes on the tier by index (holder, state, size,
crc32c, whether the holder is declared lost); a shard not cut yet has none, stripes of another
tier are not listed, and a step with no checkpoint is not found."""

from __future__ import annotations

import pytest
from sqlalchemy import func, update
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, names, placed, read_back_all
from tierpoint.catalog.models import Node
from tierpoint.catalog.reads.stripes import shard_stripes
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.errors import CheckpointNotFound


def test_each_shards_stripes_page_by_page(session: Session) -> None:
    cp, shards, holders = checkpoint(session, 3)
    # The first two shards cut and read back; the last not cut yet; one stripe of another tier.
    for shard in shards[:2]:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards[:2])
    stripes.place(session, cp, "other", str(CODE), placed(shards[0], holders)[:1])
    session.execute(update(Node).where(Node.id == holders[5]).values(lost_at=func.now()))
    job, _ = names(session, cp)

    first, after = shard_stripes(session, job, 1, TIER, limit=2)
    assert [s.path for s in first] == ["f0", "f1"] and after is not None
    rest, end = shard_stripes(session, job, 1, TIER, limit=2, after=after)
    assert [(s.path, s.code, s.stripes) for s in rest] == [("f2", None, [])] and end is None

    for listed in first:
        assert listed.code == str(CODE)
        got = [(s.index, s.node, s.state, s.holder_lost, s.size, s.crc32c) for s in listed.stripes]
        assert got == [
            (i, h, "verified", i == 5, 100 + i, f"{i:08x}") for i, h in enumerate(holders)
        ]
    # Exactly one page: no cursor past it.
    whole, none = shard_stripes(session, job, 1, TIER, limit=3)
    assert len(whole) == 3 and none is None


def test_a_step_with_no_checkpoint_is_not_found(session: Session) -> None:
    cp, _, _ = checkpoint(session, 1)
    job, _ = names(session, cp)
    with pytest.raises(CheckpointNotFound):
        shard_stripes(session, job, 2, TIER, limit=10)
