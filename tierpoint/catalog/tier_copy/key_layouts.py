"""The S3 key layout of each checkpoint's copy on a tier (`checkpoint_tier.key_layout`).

Recorded once, when the lifecycle plans the copy and before any object is written, and read by
everything that names the objects afterwards (copy, verify, scrub, repair, retention's delete, the
restore plans): a later change of the tier's setting never renames an existing copy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Replica, TierCopy
from tierpoint.storage.s3.layout import KeyLayout


def record(session: Session, checkpoint_id: int, layouts: Mapping[str, KeyLayout]) -> None:
    """Fix the layout of the checkpoint's copy on each tier of `layouts` (its tier copy must exist)
    unless one is recorded already or a replica exists there (a copy begun before layouts were
    recorded, whose objects are flat, as null says)."""
    for tier, layout in layouts.items():
        session.execute(
            update(TierCopy)
            .where(
                TierCopy.checkpoint_id == checkpoint_id,
                TierCopy.tier == tier,
                TierCopy.key_layout.is_(None),
                ~exists().where(Replica.checkpoint_id == checkpoint_id, Replica.tier == tier),
            )
            .values(key_layout=layout.name)
        )


def of_checkpoint(session: Session, checkpoint_id: int) -> dict[str, KeyLayout]:
    """The layout of the checkpoint's copy on each tier with a tier copy (flat where none is
    recorded)."""
    rows = session.execute(
        select(TierCopy.tier, TierCopy.key_layout).where(TierCopy.checkpoint_id == checkpoint_id)
    )
    return {tier: KeyLayout.parse(recorded) for tier, recorded in rows}


def on_tier(session: Session, checkpoint_ids: Collection[int], tier: str) -> dict[int, KeyLayout]:
    """The layout of each checkpoint's copy on `tier` that has a tier copy (flat where none is
    recorded). No tier copy, no entry: nothing is guessed for a copy the catalog does not know."""
    rows = session.execute(
        select(TierCopy.checkpoint_id, TierCopy.key_layout).where(
            TierCopy.checkpoint_id.in_(list(checkpoint_ids)), TierCopy.tier == tier
        )
    )
    return {cid: KeyLayout.parse(recorded) for cid, recorded in rows}
