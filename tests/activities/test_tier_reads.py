"""A worker's reads reach the tier's read throughput without waiting for another batch's
transaction that holds the tier's row (activities/tier_reads.py), on the real catalog: what
finds the row held is carried to the worker's next batch, and nothing is counted twice or lost."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from activities.tier_reads import TierReads
from tierpoint.catalog.models import TierReadStats
from tierpoint.catalog.replica import scrub

# Only time spent waiting for a lock counts against it, however busy the machine: a statement
# that does not wait never reaches it, one that waits fails within it.
WAIT_FOR_THE_ROW = "500ms"


def _stats(engine: Engine, tier: str) -> tuple[int, float] | None:
    with Session(engine) as s:
        row = s.execute(
            select(TierReadStats.bytes, TierReadStats.seconds).where(TierReadStats.tier == tier)
        ).one_or_none()
    return None if row is None else (row[0], row[1])


def _impatient(engine: Engine) -> Session:
    """A session whose statements fail rather than wait for a row lock."""
    s = Session(engine)
    s.execute(text(f"SET LOCAL lock_timeout = '{WAIT_FOR_THE_ROW}'"))
    return s


def test_reads_held_up_by_another_batch_wait_for_the_next_batch_not_for_the_row(
    engine: Engine,
) -> None:
    tier = f"tier-{uuid.uuid4().hex[:8]}"
    reads = TierReads()
    # The tier's first reads insert its row.
    with Session(engine) as s:
        reads.record(s, tier, 100, 1.0)
        s.commit()
    assert _stats(engine, tier) == (100, 1.0)

    with Session(engine) as other:
        # Another batch's last transaction, not yet committed, has added to the row.
        scrub.record_reads(other, tier, 1000, 1.0)
        # The control: a plain upsert waits for it, here until the lock timeout.
        with _impatient(engine) as s, pytest.raises(OperationalError, match="lock timeout"):
            scrub.record_reads(s, tier, 1, 1.0)
        # This worker's batch does not wait: it commits with its reads held.
        with _impatient(engine) as s:
            reads.record(s, tier, 500, 0.5)
            s.commit()
        assert reads.held(tier) == (500, 0.5)
        other.commit()
    assert _stats(engine, tier) == (1100, 2.0)

    # The next batch of the tier carries them with its own.
    with Session(engine) as s:
        reads.record(s, tier, 200, 0.25)
        s.commit()
    assert reads.held(tier) == (0, 0.0)
    assert _stats(engine, tier) == (1800, 2.75)


def test_a_batch_that_read_nothing_at_full_speed_writes_nothing(engine: Engine) -> None:
    tier = f"tier-{uuid.uuid4().hex[:8]}"
    reads = TierReads()
    with Session(engine) as s:
        reads.record(s, tier, 0, 0.0)
        s.commit()
    assert _stats(engine, tier) is None
    assert reads.held(tier) == (0, 0.0)
