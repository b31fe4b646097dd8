"""A coded peer tier's copies as retention counts them, in the replicas' terms: a copy is
verified while every shard keeps at least k stripes that count (coverage.py's rule: verified, on
a holder not declared lost), it occupies the bytes of the stripes its holders keep, and it is on
a lost node when a holder of one of its stripes was declared lost."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.orm import Session
from tierpoint_client.erasure.code import parse_code

from tierpoint.catalog.models import Node, Stripe, TierCopy
from tierpoint.catalog.stripe.coverage import counting
from tierpoint.states import ReplicaState, TierState

# Bytes a stripe occupies on its holder: written (a pending stripe is being pulled or cut).
_HELD = (ReplicaState.VERIFIED, ReplicaState.CORRUPT, ReplicaState.EXPIRING)


def _unexpired(job_id: int, names: Sequence[str]) -> ColumnElement[bool]:
    # Only copies not expired, as the replicas' totals: a long job's history is mostly expired.
    return and_(
        TierCopy.checkpoint_id == Stripe.checkpoint_id,
        TierCopy.tier == Stripe.tier,
        TierCopy.job_id == job_id,
        TierCopy.tier.in_(list(names)),
        TierCopy.state != TierState.EXPIRED.value,
    )


def stripe_totals(
    session: Session, job_id: int, names: Sequence[str], shard_counts: dict[int, int]
) -> dict[tuple[int, str], tuple[int, int, int]]:
    """(checkpoint id, tier) -> (shards it keeps decodable, bytes its stripes hold, stripes on
    a node declared lost), for every coded copy of the job not expired. A copy whose every shard
    is decodable counts as `shard_counts` shards verified, as a copy with a replica of each."""
    on = _unexpired(job_id, names)
    held = case(
        (Stripe.state.in_([s.value for s in _HELD]), Stripe.size),
        else_=0,
    )
    sums = session.execute(
        select(
            Stripe.checkpoint_id,
            Stripe.tier,
            func.min(Stripe.code).label("code"),
            func.coalesce(func.sum(held), 0).label("bytes"),
            func.count().filter(Node.lost_at.is_not(None)).label("on_lost"),
        )
        .join(TierCopy, on)
        .outerjoin(Node, Node.id == Stripe.node_id)
        .group_by(Stripe.checkpoint_id, Stripe.tier)
    ).all()
    if not sums:
        return {}
    per_shard = (
        counting(
            select(
                Stripe.checkpoint_id,
                Stripe.tier,
                Stripe.shard_id,
                func.count(func.distinct(Stripe.stripe_index)).label("n"),
            )
        )
        .join(TierCopy, on)
        .group_by(Stripe.checkpoint_id, Stripe.tier, Stripe.shard_id)
        .subquery()
    )
    ks = {(r.checkpoint_id, r.tier): parse_code(r.code).k for r in sums}
    decodable: dict[tuple[int, str], int] = {}
    for cp, tier, n in session.execute(
        select(per_shard.c.checkpoint_id, per_shard.c.tier, per_shard.c.n)
    ):
        # guard: retention-coded-copy-needs-k-stripes
        if n >= ks.get((cp, tier), n + 1):
            decodable[(cp, tier)] = decodable.get((cp, tier), 0) + 1
    return {
        (r.checkpoint_id, r.tier): (
            # Every shard decodable counts as every shard verified; otherwise short of it.
            shard_counts.get(r.checkpoint_id, 0)
            if decodable.get((r.checkpoint_id, r.tier), 0) == shard_counts.get(r.checkpoint_id, 0)
            else 0,
            int(r.bytes),
            int(r.on_lost),
        )
        for r in sums
    }
