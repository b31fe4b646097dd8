"""What a rebuild of a coded copy reads from the catalog: which checkpoints have stripes for it to
cut again (`due`, asked by whoever found a stripe bad); each shard's stripe set as it stands
(which index each node holds, in which state), for the plan that gives lost stripes new holders;
and, for the new holder, what each file must decode to and where its other stripes are held."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Node, Shard, Stripe, TierCopy
from tierpoint.states import ReplicaState, TierState


@dataclass(frozen=True)
class Member:
    index: int
    node: str
    state: str


@dataclass
class StripeSet:
    """One shard's stripes on a coded tier (not expiring nor expired), by index."""

    shard_id: int
    node: str  # the shard's node
    ordinal: int
    size: int  # the file's
    members: list[Member] = field(default_factory=list)


def copy_state(session: Session, checkpoint_id: int, tier: str) -> str | None:
    return session.scalar(
        select(TierCopy.state).where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
    )


def due(session: Session, tier: str, checkpoint_ids: Iterable[int]) -> list[int]:
    """Of `checkpoint_ids`, those whose restorable coded copy on `tier` has a stripe found bad
    (corrupt, or lost) on a holder not declared lost: the stripes its rebuild's plan cuts again.
    A lost node's stripes are its declaration's to ask for (`services/node_lost.py`); a copy that
    failed (some set below k) has nothing to cut them from, and one expiring is retention's."""
    ids = sorted(set(checkpoint_ids))
    if not ids:
        return []
    return list(
        session.scalars(
            select(Stripe.checkpoint_id)
            .join(
                TierCopy,
                (TierCopy.checkpoint_id == Stripe.checkpoint_id) & (TierCopy.tier == Stripe.tier),
            )
            .join(Node, Node.id == Stripe.node_id)
            .where(
                Stripe.checkpoint_id.in_(ids),
                Stripe.tier == tier,
                Stripe.state.in_([ReplicaState.CORRUPT.value, ReplicaState.LOST.value]),
                Node.lost_at.is_(None),
                TierCopy.state == TierState.RESTORABLE.value,
            )
            .distinct()
            .order_by(Stripe.checkpoint_id)
        )
    )


def stripe_sets(session: Session, checkpoint_id: int, tier: str) -> list[StripeSet]:
    """Every shard's stripe set on `tier` with a stripe not expiring nor expired, in the order of
    its node and ordinal."""
    rows = session.execute(
        select(
            Shard.id,
            Shard.node_id,
            Shard.ordinal,
            Shard.size,
            Stripe.stripe_index,
            Stripe.node_id,
            Stripe.state,
        )
        .join(Shard, Shard.id == Stripe.shard_id)
        .where(
            Stripe.checkpoint_id == checkpoint_id,
            Stripe.tier == tier,
            Stripe.state.not_in([ReplicaState.EXPIRING.value, ReplicaState.EXPIRED.value]),
        )
        .order_by(Shard.node_id, Shard.ordinal, Stripe.stripe_index)
    )
    sets: dict[int, StripeSet] = {}
    for shard, node, ordinal, size, index, holder, state in rows:
        at = sets.setdefault(shard, StripeSet(shard, node, ordinal, size))
        at.members.append(Member(index, holder, state))
    return list(sets.values())


@dataclass(frozen=True)
class File:
    """What a stripe set must decode to: the shard's registered size and crc32c."""

    size: int
    crc32c: str


def files(session: Session, shard_ids: Iterable[int]) -> dict[int, File]:
    ids = sorted(set(shard_ids))
    if not ids:
        return {}
    rows = session.execute(
        select(Shard.id, Shard.size, Shard.checksum).where(
            Shard.id.in_(ids), Shard.checksum_algorithm == "crc32c", Shard.checksum.is_not(None)
        )
    )
    return {sid: File(size, crc) for sid, size, crc in rows if crc is not None}
