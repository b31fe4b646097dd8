"""What the scrub reads of the stripe table (catalog/stripe/scrub.py), on a real catalog: a
holder's verified stripes only, read longest ago first, within a budget; a good read counted
once per pick in the tier's totals."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, placed, read_back_all
from tierpoint.catalog.models import ScrubStats, Stripe
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe import scrub


def test_a_holders_due_stripes_oldest_first_and_each_good_read_counted_once(
    session: Session,
) -> None:
    cp, shards, holders = checkpoint(session, 3)
    for shard in shards:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    read_back_all(session, shards[:2])  # the third shard's stripes stay pending
    # One transaction: now() does not move, so the read-backs are dated an hour back.
    session.execute(update(Stripe).values(verified_at=func.now() - timedelta(hours=1)))
    now = session.scalar(select(func.now()))
    assert now is not None
    later = now
    ids, nbytes = scrub.due(session, TIER, holders[0], timedelta(0), later, 1 << 30, 100)
    assert len(ids) == 2
    targets = scrub.targets(session, ids)
    assert {(t.shard_id, t.index, t.state) for t in targets} == {
        (shards[0], 0, "verified"),
        (shards[1], 0, "verified"),
    }
    assert nbytes == sum(t.size for t in targets)
    # A budget smaller than one stripe still takes one.
    assert len(scrub.due(session, TIER, holders[0], timedelta(0), later, 1, 100)[0]) == 1
    # Read recently enough: not due under a minimum age.
    assert scrub.due(session, TIER, holders[0], timedelta(days=1), later, 1 << 30, 100)[0] == []
    # Another holder's stripes are its own unit's.
    others = scrub.due(session, TIER, holders[1], timedelta(0), later, 1 << 30, 100)[0]
    assert {t.index for t in scrub.targets(session, others)} == {1}

    assert scrub.record_good(session, TIER, ids, later) == (2, nbytes)
    # The same pick again (a retried batch): not counted twice.
    assert scrub.record_good(session, TIER, ids, later) == (0, 0)
    stats = session.get(ScrubStats, TIER)
    assert stats is not None and (stats.stripes, stats.bytes, stats.replicas) == (2, nbytes, 0)
    # Read now: due again only for a later run.
    assert scrub.due(session, TIER, holders[0], timedelta(0), now, 1 << 30, 100)[0] == []
