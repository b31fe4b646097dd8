"""Catalog reads behind Prometheus metrics that the operator views do not already give: the
promotion lag of one checkpoint (workers) and the pending tier copies per tier (the API's
refresher). Both are bounded: one row by primary key, and the pending tier copies, which a
partial index holds apart however large the catalog grows."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, TierCopy
from tierpoint.states import TierState


def seconds_since_registration(session: Session, checkpoint_id: int) -> float | None:
    """now() - the checkpoint's registration, in the caller's transaction: called in the
    transaction that promoted a tier copy, it is that tier copy's registration -> restorable lag
    (now() is the transaction's start time, the value its restorable_at got)."""
    value = session.scalar(
        select(func.extract("epoch", func.now() - Checkpoint.created_at)).where(
            Checkpoint.id == checkpoint_id
        )
    )
    return None if value is None else max(float(value), 0.0)


def pending_tier_copies_by_tier(session: Session) -> dict[str, int]:
    """Tier -> tier copies still pending (checkpoints in flight to that tier)."""
    ct = TierCopy
    rows = session.execute(
        select(ct.tier, func.count()).where(ct.state == TierState.PENDING.value).group_by(ct.tier)
    )
    return {tier: int(n) for tier, n in rows}
