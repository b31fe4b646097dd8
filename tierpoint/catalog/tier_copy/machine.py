"""Tier copies: a checkpoint's copy on one tier as a whole."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, exists
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import CheckpointHead
from tierpoint.catalog.models import Replica, TierCopy
from tierpoint.states import TierState


def ensure_tier_copies(session: Session, head: CheckpointHead, tiers: Sequence[str]) -> None:
    """A `pending` marker per target tier; existing markers keep their state."""
    if not tiers:
        return
    stmt = insert(TierCopy).values(
        [
            {
                "checkpoint_id": head.id,
                "tier": t,
                "job_id": head.job_id,
                "step": head.step,
                "state": TierState.PENDING.value,
            }
            for t in tiers
        ]
    )
    session.execute(stmt.on_conflict_do_nothing(index_elements=["checkpoint_id", "tier"]))


def drop_skipped_tier_copies(
    session: Session, head: CheckpointHead, skipped: Sequence[str]
) -> None:
    """Tiers the retention policy does not send this checkpoint to (promote_every) get no marker:
    remove the `pending` ones registration created, unless a copy was started there already."""
    if not skipped:
        return
    session.execute(
        delete(TierCopy).where(
            TierCopy.checkpoint_id == head.id,
            TierCopy.tier.in_(skipped),
            TierCopy.state == TierState.PENDING.value,
            ~exists().where(Replica.checkpoint_id == head.id, Replica.tier == TierCopy.tier),
        )
    )
