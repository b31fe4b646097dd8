"""A checkpoint's coded copy on one coded peer tier, shard by shard: each shard's stripes (index,
holder, state, size, crc32c, and whether the holder is declared lost), a page of shards at a time
in the manifest's order. What the operator views' `coverage` counts, shown stripe by stripe."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import no_checkpoint, require_job_id
from tierpoint.catalog.locks import at_step
from tierpoint.catalog.models import Checkpoint, Job, Node, Shard, Stripe


@dataclass(frozen=True)
class StripeView:
    index: int
    node: str
    # Declared lost: the stripe no longer counts, whatever its row's state says.
    holder_lost: bool
    state: str
    size: int
    crc32c: str
    verified_at: datetime | None
    scrubbed_at: datetime | None
    error: str | None


@dataclass
class ShardStripesView:
    path: str
    size: int
    node: str
    code: str | None
    stripes: list[StripeView] = field(default_factory=list)


def shard_stripes(
    session: Session,
    job: str,
    step: int,
    tier: str,
    *,
    branch: int | None = None,
    limit: int,
    after: int | None = None,
) -> tuple[list[ShardStripesView], int | None]:
    """Up to `limit` shards of the checkpoint after manifest ordinal `after`, each with its
    stripes on `tier` by index (none yet: an empty list), and the ordinal to continue after
    (None at the end). CheckpointNotFound / JobNotFound when there is no such checkpoint."""
    cp = session.scalar(
        select(Checkpoint.id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.name == job, at_step(step, branch))
    )
    if cp is None:
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    q = select(Shard.id, Shard.ordinal, Shard.path, Shard.size, Shard.node_id).where(
        Shard.checkpoint_id == cp
    )
    if after is not None:
        q = q.where(Shard.ordinal > after)
    shards = session.execute(q.order_by(Shard.ordinal).limit(limit + 1)).all()
    more = len(shards) > limit
    shards = shards[:limit]
    if not shards:
        return [], None
    rows = session.execute(
        select(
            Stripe.shard_id,
            Stripe.stripe_index,
            Stripe.code,
            Stripe.node_id,
            Node.lost_at.is_not(None).label("holder_lost"),
            Stripe.state,
            Stripe.size,
            Stripe.crc32c,
            Stripe.verified_at,
            Stripe.scrubbed_at,
            Stripe.error,
        )
        .join(Node, Node.id == Stripe.node_id)
        .where(
            Stripe.checkpoint_id == cp,
            Stripe.tier == tier,
            Stripe.shard_id.in_([s.id for s in shards]),
        )
        .order_by(Stripe.shard_id, Stripe.stripe_index)
    ).all()
    by_shard: dict[int, list[StripeView]] = defaultdict(list)
    codes: dict[int, str] = {}
    for r in rows:
        codes[r.shard_id] = r.code
        by_shard[r.shard_id].append(
            StripeView(
                r.stripe_index,
                r.node_id,
                bool(r.holder_lost),
                r.state,
                r.size,
                r.crc32c,
                r.verified_at,
                r.scrubbed_at,
                r.error,
            )
        )
    out = [
        ShardStripesView(s.path, s.size, s.node_id, codes.get(s.id), by_shard.get(s.id, []))
        for s in shards
    ]
    return out, shards[-1].ordinal if more else None
