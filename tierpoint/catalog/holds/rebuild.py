"""The sources of a copy being made again: while re-replication or repair re-makes a checkpoint's
copy on one tier from its copies on other tiers, retention keeps those (`rebuild_source`). A
coded copy's rebuild reads the copy itself (its stripes on their holders cut the lost or bad ones
again): it holds its own tier (`hold_own_stripes`), so retention keeps the copy until the rebuild
ends rather than deleting stripes a rebuild is reading.

The plan of the rebuild records them on the tier copy being re-made (`rebuild_from`) with a time
limit (`rebuild_until`), under the checkpoint's row lock, the lock retention's `begin_expiry`
takes before it re-checks an expiry: either the expiry wins (the source is `expiring` and the plan
does not read it) or the plan does (the re-check sees the hold and skips the expiry). Each batch
of the rebuild renews the limit when it starts, and the promotion of the tier, whether the copy
was made or given up, clears the hold (`promotion.promote`).

Never forever: a rebuild that stops without a promotion (its run terminated, its history lost)
lets its sources go at most REBUILD_HOLD after its last batch began. A running one renews sooner: a
batch attempt lasts at most BATCH_TIMEOUT, and the next one starts within minutes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import func, null, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import TierCopy
from tierpoint.contract.lifecycle import BATCH_TIMEOUT

REBUILD_HOLD = BATCH_TIMEOUT + timedelta(hours=1)


def hold_sources(
    session: Session, checkpoint_id: int, tier: str, sources: Iterable[str], now: datetime
) -> None:
    """Record that the copy on `tier` is being made again from `sources` (none: release it)."""
    names = sorted(set(sources) - {tier})
    if not names:
        release(session, checkpoint_id, tier)
        return
    _hold(session, checkpoint_id, tier, names, now)


def hold_own_stripes(session: Session, checkpoint_id: int, tier: str, now: datetime) -> None:
    """Record that the coded copy on `tier` is being cut again from its own stripes: it is its
    rebuild's source (whatever its state: a restorable copy is the one rebuilt)."""
    # guard: coded-rebuild-holds-its-own-copy
    _hold(session, checkpoint_id, tier, [tier], now)


def _hold(session: Session, checkpoint_id: int, tier: str, names: list[str], now: datetime) -> None:
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
        .values(rebuild_from=names, rebuild_until=now + REBUILD_HOLD)
    )


def release(session: Session, checkpoint_id: int, tier: str) -> None:
    """The rebuild of the copy on `tier` ended (made or given up): its sources are released."""
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
        # SQL NULL, not a JSON null: "no hold" is `rebuild_from IS NULL`
        .values(rebuild_from=null(), rebuild_until=None)
    )


def renew(session: Session, checkpoint_id: int) -> None:
    """A batch of a rebuild of the checkpoint starts: its holds last REBUILD_HOLD from now."""
    session.execute(
        update(TierCopy)
        .where(
            TierCopy.checkpoint_id == checkpoint_id,
            TierCopy.rebuild_from.is_not(None),
        )
        .values(rebuild_until=func.now() + REBUILD_HOLD)
    )
