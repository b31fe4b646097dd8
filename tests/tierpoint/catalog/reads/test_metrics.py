"""The catalog reads behind Prometheus metrics, on a real catalog: a checkpoint's head with its
age in the reader's transaction, and the pending tier copies per tier."""

from __future__ import annotations

from sqlalchemy import func, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.catalog.reads.metrics import head_and_age, pending_tier_copies_by_tier


def test_the_age_of_a_checkpoint_is_counted_from_its_registration_to_the_transaction(
    session: Session,
) -> None:
    job = job_row(session)
    now = checkpoint_row(session, job.id, 1)
    hour_ago = checkpoint_row(session, job.id, 2)
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == hour_ago)
        .values(created_at=func.now() - text("interval '1 hour'"))
    )
    # now() is the transaction's start: the promotion's own transaction reads its lag exactly.
    assert head_and_age(session, now) == (checkpoint_head(session, now), 0.0)
    assert head_and_age(session, hour_ago) == (checkpoint_head(session, hour_ago), 3600.0)
    assert head_and_age(session, -1) is None


def test_pending_tier_copies_are_counted_per_tier(session: Session) -> None:
    before = pending_tier_copies_by_tier(session)
    job = job_row(session)
    for step in (1, 2):
        checkpoint_row(session, job.id, step, tiers=("ssd", "lustre"))
    done = checkpoint_row(session, job.id, 3, tiers=("lustre",))
    session.execute(
        update(TierCopy).where(TierCopy.checkpoint_id == done).values(state="restorable")
    )
    after = pending_tier_copies_by_tier(session)
    assert after["ssd"] - before.get("ssd", 0) == 2
    assert after["lustre"] - before.get("lustre", 0) == 2
