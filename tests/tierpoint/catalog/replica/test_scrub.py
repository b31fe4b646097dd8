"""The scrub's picks on a real catalog: the replicas read longest ago first, within the budget,
each read counted once."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.catalog_rows import replica_ids, verified_everywhere
from tests.helpers.lifecycle import new_job
from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.models import (
    Replica,
    ScrubStats,
)
from tierpoint.catalog.replica import scrub
from tierpoint.config import Settings


def test_scrub_picks_oldest_reads_first_within_budget_and_counts_once(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    # Read longer ago than any other replica of this module's catalog (those: 1 day).
    older = verified_everywhere(settings, sessions, new_job(), 5, age_days=100)
    newer = verified_everywhere(settings, sessions, new_job(), 6, age_days=50)
    with sessions.begin() as s:
        now = catalog_now(s)
        stats = s.get(ScrubStats, "lustre")
        before = (stats.replicas, stats.bytes) if stats else (0, 0)
        ids, nbytes = scrub.due(s, "lustre", None, timedelta(0), now, budget=250, limit=10)
    older_ids = replica_ids(sessions, older.checkpoint_id, "lustre")
    newer_ids = replica_ids(sessions, newer.checkpoint_id, "lustre")
    assert ids[:2] == sorted(older_ids)[:2] and nbytes == 200, (ids, older_ids)
    with sessions.begin() as s:
        assert scrub.record_good(s, "lustre", ids, now) == 200
        assert scrub.record_good(s, "lustre", ids, now) == 0  # a retried batch
        again, _ = scrub.due(s, "lustre", None, timedelta(0), now, budget=10**9, limit=1000)
        stats = s.get(ScrubStats, "lustre")
        assert stats is not None
        assert (stats.replicas - before[0], stats.bytes - before[1]) == (2, 200)
    assert not set(ids) & set(again)
    assert set(newer_ids) <= set(again)
    # With a node: only that node's replicas of a local tier.
    with sessions.begin() as s:
        local, _ = scrub.due(s, "ssd", "node-b", timedelta(0), now, 10**9, 1000)
        nodes = set(s.scalars(select(Replica.node_id).where(Replica.id.in_(local))))
    assert nodes == {"node-b"}
