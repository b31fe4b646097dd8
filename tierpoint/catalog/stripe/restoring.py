"""What a restore reads of a coded copy: the stripes verified on holders not declared lost, per
shard (the plan's), and the one stripe a holder's data endpoint serves for a request."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Stripe
from tierpoint.catalog.stripe.coverage import counting
from tierpoint.catalog.stripe.encoding import named_size


@dataclass(frozen=True)
class HeldStripe:
    """A stripe a restore may read: its index in the set, its holder, the encoder's size and
    crc32c (the holder's read-back matched them)."""

    index: int
    node: str
    size: int
    crc32c: str


def restorable_stripes(
    session: Session, checkpoint_id: int, tier: str
) -> dict[int, list[HeldStripe]]:
    """Shard id -> its stripes on `tier` verified on a holder not declared lost, by index: the
    same stripes `coverage.verified_stripes` counts (`coverage.counting`), so a plan offers what
    promotion judged."""
    rows = session.execute(
        counting(
            select(Stripe.shard_id, Stripe.stripe_index, Stripe.node_id, Stripe.size, Stripe.crc32c)
        )
        .where(Stripe.checkpoint_id == checkpoint_id, Stripe.tier == tier)
        .order_by(Stripe.shard_id, Stripe.stripe_index)
    )
    out: dict[int, list[HeldStripe]] = {}
    for shard, index, node, size, crc in rows:
        out.setdefault(shard, []).append(HeldStripe(index, node, size, crc))
    return out


def held_size(
    session: Session, node: str, tier: str, index: int, job: str, step: int, branch: int, path: str
) -> int | None:
    """The size of stripe `index` of shard `path` while `node` holds it verified (the holder's
    read-back matched the encoder's size and crc32c) and is not declared lost; None otherwise:
    what a holder's data endpoint serves to a restore."""
    named = named_size(job=job, step=step, branch=branch, path=path, tier=tier, index=index)
    return session.scalar(counting(named).where(Stripe.node_id == node))
