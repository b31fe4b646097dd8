"""Catalog reads behind Prometheus metrics that the operator views do not already give: the
promotion lag of one checkpoint, read with its head (workers), and the pending tier copies per
tier (the API's refresher). Both are bounded: one row by primary key, and the pending tier
copies, which a partial index holds apart however large the catalog grows."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import CheckpointHead, head_query
from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.states import TierState


def head_and_age(session: Session, checkpoint_id: int) -> tuple[CheckpointHead, float] | None:
    """The checkpoint's head and now() - its registration, in one statement of the caller's
    transaction: in the transaction that promotes a tier copy, the age is that copy's
    registration -> restorable lag (now() is the transaction's start time, the value its
    restorable_at gets, whichever statement reads it). None if the checkpoint is gone."""
    age = func.extract("epoch", func.now() - Checkpoint.created_at)
    row = session.execute(head_query(checkpoint_id, age)).one_or_none()
    if row is None:
        return None
    *head, age = row
    return CheckpointHead(*head), max(float(age), 0.0)


def pending_tier_copies_by_tier(session: Session) -> dict[str, int]:
    """Tier -> tier copies still pending (checkpoints in flight to that tier)."""
    ct = TierCopy
    rows = session.execute(
        select(ct.tier, func.count()).where(ct.state == TierState.PENDING.value).group_by(ct.tier)
    )
    return {tier: int(n) for tier, n in rows}
