"""Catalog side of the scrub of a coded peer tier: which verified stripes a holder is due to read
back (oldest read first, through `ix_stripe_scrub_due`), what a batch reads, and recording the
ones read back good with the tier's totals. A stripe read back bad is moved by
`tier_copy/stripe_damage.py`, never here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job, Shard, Stripe
from tierpoint.catalog.replica.scrub import add_totals, within_budget
from tierpoint.states import ReplicaState

VERIFIED = ReplicaState.VERIFIED.value
_last_read = func.coalesce(Stripe.scrubbed_at, Stripe.verified_at)


@dataclass(frozen=True)
class StripeTarget:
    """One stripe a holder reads back: it lies at its shard's name under the holder's root of
    the tier, and must have the size and crc32c the encoder recorded."""

    stripe_id: int
    checkpoint_id: int
    shard_id: int
    index: int
    job: str
    step: int
    branch: int
    path: str
    size: int
    crc32c: str
    state: str


def due(
    session: Session,
    tier: str,
    holder: str,
    min_age: timedelta,
    cutoff: datetime,
    budget: int,
    limit: int,
) -> tuple[list[int], int]:
    """Verified stripes `holder` holds on `tier`, last read before both `now - min_age` and
    `cutoff`, oldest first, as many as fit `budget` bytes (at least one) and `limit`."""
    q = (
        select(Stripe.id, Stripe.size)
        .where(
            Stripe.tier == tier,
            Stripe.node_id == holder,
            Stripe.state == VERIFIED,
            _last_read < func.least(func.now() - min_age, cutoff),
        )
        .order_by(_last_read, Stripe.id)
        .limit(limit)
    )
    return within_budget(session.execute(q), budget)


def targets(session: Session, stripe_ids: Sequence[int]) -> list[StripeTarget]:
    rows = session.execute(
        select(
            Stripe.id,
            Stripe.checkpoint_id,
            Stripe.shard_id,
            Stripe.stripe_index,
            Job.name,
            Checkpoint.step,
            Checkpoint.branch,
            Shard.path,
            Stripe.size,
            Stripe.crc32c,
            Stripe.state,
        )
        .join(Shard, Shard.id == Stripe.shard_id)
        .join(Checkpoint, Checkpoint.id == Stripe.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Stripe.id.in_(list(stripe_ids)))
        .order_by(Stripe.id)
    ).all()
    return [StripeTarget(*r) for r in rows]


def record_good(
    session: Session, tier: str, stripe_ids: Sequence[int], picked_at: datetime
) -> tuple[int, int]:
    """scrubbed_at = now for stripes still verified, counted once per pick (a retried batch does
    not count a stripe again). Returns (stripes, bytes) newly counted."""
    if not stripe_ids:
        return 0, 0
    sizes = session.scalars(
        update(Stripe)
        .where(
            Stripe.id.in_(list(stripe_ids)),
            Stripe.state == VERIFIED,
            _last_read < picked_at,
        )
        .values(scrubbed_at=func.now())
        .returning(Stripe.size)
    ).all()
    if not sizes:
        return 0, 0
    nbytes = sum(sizes)
    add_totals(session, tier, stripes=len(sizes), bytes=nbytes, last_scrubbed_at=func.now())
    return len(sizes), nbytes


def checkpoint_stripes(
    session: Session, checkpoint_id: int, tier: str, after_id: int, limit: int
) -> list[tuple[int, str]]:
    """The checkpoint's verified stripes on coded tier `tier` after `after_id`: (id, holder), by
    id (an operator's verification of the copy reads them all, pick by pick)."""
    rows = session.execute(
        select(Stripe.id, Stripe.node_id)
        .where(
            Stripe.checkpoint_id == checkpoint_id,
            Stripe.tier == tier,
            Stripe.state == VERIFIED,
            Stripe.id > after_id,
        )
        .order_by(Stripe.id)
        .limit(limit)
    ).all()
    return [(sid, node) for sid, node in rows]
