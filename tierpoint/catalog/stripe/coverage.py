"""What a coded peer tier's stripes make restorable: invariant 1 for stripes.

A checkpoint's coded copy is promoted (made restorable) only when every shard has all k+m
stripes verified on holders not declared lost, and it stays restorable while every shard keeps
at least k of them: any k verified stripes give the file back, and the decoded file is checked
against the shard's registered crc32c before a byte is handed on (tierpoint_client.erasure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Select, and_, func, select
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.models import Node, Shard, Stripe
from tierpoint.states import ReplicaState

_Q = TypeVar("_Q", bound="Select[*tuple[Any, ...]]")


def counting(q: _Q) -> _Q:
    """`q` kept to the stripes that count for a coded copy: verified on a holder not declared
    lost. Promotion counts these, a restore plan offers these and a holder serves these."""
    return q.join(Node, Node.id == Stripe.node_id).where(
        # guard: coverage-view-counts-verified-stripes
        Stripe.state == ReplicaState.VERIFIED.value,
        Node.lost_at.is_(None),
    )


def verified_stripes(session: Session, checkpoint_id: int, tier: str) -> dict[int, int]:
    """Shard id -> its stripes on `tier` verified on a holder not declared lost; every shard of
    the checkpoint is a key (0 for one with none)."""
    counts = (
        counting(select(Stripe.shard_id, func.count(func.distinct(Stripe.stripe_index)).label("n")))
        .where(Stripe.checkpoint_id == checkpoint_id, Stripe.tier == tier)
        .group_by(Stripe.shard_id)
        .subquery()
    )
    rows = session.execute(
        select(Shard.id, func.coalesce(counts.c.n, 0))
        .outerjoin(counts, counts.c.shard_id == Shard.id)
        .where(Shard.checkpoint_id == checkpoint_id)
    )
    return {shard: int(n) for shard, n in rows}


@dataclass(frozen=True)
class Coverage:
    """A coded copy's standing: promotable (every set whole), restorable (every set decodable),
    and the shards that hold it back from each."""

    promotable: bool
    restorable: bool
    not_whole: list[int]
    not_decodable: list[int]


def coverage(code: Code, counts: Mapping[int, int]) -> Coverage:
    """The rule, over `verified_stripes`' counts. A checkpoint with no shard is trivially both."""
    not_whole = sorted(s for s, n in counts.items() if n < code.width)
    # guard: coded-copy-needs-k-stripes
    not_decodable = sorted(s for s, n in counts.items() if n < code.k)
    return Coverage(not not_whole, not not_decodable, not_whole, not_decodable)


@dataclass(frozen=True)
class CodedCoverage:
    """What an operator reads of a coded copy: of its sets (one per shard), how many are whole
    (k+m verified stripes), degraded (k or more, short of k+m: `stripes_short` stripes missing
    among them) and below k (no restore decodes them); `least_margin` is the fewest verified
    stripes of a set minus k (how many more losses the weakest set survives; negative below k,
    None for a checkpoint without shards)."""

    code: str
    sets: int
    whole: int
    degraded: int
    stripes_short: int
    below_k: int
    least_margin: int | None


def summaries(
    session: Session, tier: str, code: Code, checkpoint_ids: Sequence[int]
) -> dict[int, CodedCoverage]:
    """`CodedCoverage` of each checkpoint's copy on `tier`, counted as `verified_stripes` counts
    (verified on holders not declared lost), in one query over the checkpoints' shards."""
    if not checkpoint_ids:
        return {}
    counts = (
        counting(select(Stripe.shard_id, func.count(func.distinct(Stripe.stripe_index)).label("n")))
        .where(Stripe.checkpoint_id.in_(list(checkpoint_ids)), Stripe.tier == tier)
        .group_by(Stripe.shard_id)
        .subquery()
    )
    n = func.coalesce(counts.c.n, 0)
    degraded = and_(n >= code.k, n < code.width)
    rows = session.execute(
        select(
            Shard.checkpoint_id,
            func.count(),
            func.count().filter(n >= code.width),
            func.count().filter(degraded),
            func.coalesce(func.sum(code.width - n).filter(degraded), 0),
            func.count().filter(n < code.k),
            func.min(n),
        )
        .outerjoin(counts, counts.c.shard_id == Shard.id)
        .where(Shard.checkpoint_id.in_(list(checkpoint_ids)))
        .group_by(Shard.checkpoint_id)
    )
    out = {
        cp: CodedCoverage(
            str(code),
            int(sets),
            int(whole),
            int(deg),
            int(short),
            int(below),
            None if least is None else int(least) - code.k,
        )
        for cp, sets, whole, deg, short, below, least in rows
    }
    for cp in checkpoint_ids:
        out.setdefault(cp, CodedCoverage(str(code), 0, 0, 0, 0, 0, None))
    return out
