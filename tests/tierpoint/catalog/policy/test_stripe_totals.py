"""A coded copy as retention counts it, over rows written by hand: verified while every shard
keeps k stripes on holders not declared lost, the bytes its stripes hold, and a lost holder
noted. Before, retention read a coded copy's replicas, of which it has none: never verified and
0 bytes, so `keep_last` on a coded tier kept every copy and a quota never freed a byte."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import job_row
from tierpoint.catalog.models import (
    Checkpoint,
    Job,
    Node,
    Replica,
    RetentionPolicy,
    Shard,
    Stripe,
    TierCopy,
)
from tierpoint.catalog.policy.snapshot import dry_run, take_snapshot
from tierpoint.catalog.policy.stripe_totals import stripe_totals
from tierpoint.retention.policy import TierRef
from tierpoint.tier_config import TierKind

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
TIERS = (TierRef("ssd", TierKind.LOCAL), TierRef("coded", TierKind.PEER))
SIZES = (1000, 3000)  # two shards; rs(2,1): each cut into 3 stripes of half the file


def _nodes(session: Session) -> list[str]:
    nodes = [f"n-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    session.add_all(Node(id=n, local_roots={}) for n in nodes)
    session.flush()
    return nodes


def _coded_checkpoint(session: Session, job: Job, nodes: list[str], step: int) -> Checkpoint:
    """A checkpoint written on nodes[0], restorable on ssd (a verified replica of each shard)
    and on the coded tier, whose stripes i of every shard are on nodes[1 + i]."""
    cp = Checkpoint(
        job_id=job.id,
        step=step,
        created_at=NOW - timedelta(hours=100 - step),
        total_bytes=sum(SIZES),
        shard_count=len(SIZES),
        manifest_digest="0" * 64,
    )
    session.add(cp)
    session.flush()
    for tier in ("ssd", "coded"):
        session.add(
            TierCopy(checkpoint_id=cp.id, tier=tier, job_id=job.id, step=step, state="restorable")
        )
    for i, size in enumerate(SIZES):
        shard = Shard(checkpoint_id=cp.id, ordinal=i, path=f"s{i}", size=size, node_id=nodes[0])
        session.add(shard)
        session.flush()
        session.add(
            Replica(
                shard_id=shard.id,
                checkpoint_id=cp.id,
                tier="ssd",
                node_id=nodes[0],
                state="verified",
                location=f"/x/ssd/{shard.path}",
                bytes_done=size,
            )
        )
        session.add_all(
            Stripe(
                shard_id=shard.id,
                checkpoint_id=cp.id,
                tier="coded",
                stripe_index=x,
                code="rs(2,1)",
                node_id=nodes[1 + x],
                size=size // 2,
                crc32c="00000000",
                state="verified",
            )
            for x in range(3)
        )
    session.flush()
    return cp


def _stripe(session: Session, cp: Checkpoint, ordinal: int, index: int, state: str) -> None:
    shard = session.query(Shard).filter_by(checkpoint_id=cp.id, ordinal=ordinal).one()
    session.execute(
        update(Stripe)
        .where(Stripe.shard_id == shard.id, Stripe.stripe_index == index)
        .values(state=state)
    )


@pytest.mark.query_unit
def test_a_coded_copy_counts_as_verified_while_every_shard_keeps_k_stripes(
    session: Session,
) -> None:
    nodes = _nodes(session)
    job = job_row(session)
    cp = _coded_checkpoint(session, job, nodes, 1)
    whole = sum(s // 2 for s in SIZES) * 3

    def totals() -> tuple[int, int, int]:
        return stripe_totals(session, job.id, ["ssd", "coded"], {cp.id: 2})[(cp.id, "coded")]

    assert totals() == (2, whole, 0)
    copy = take_snapshot(session, job.name, TIERS, NOW).checkpoints[0].copies["coded"]
    assert (copy.verified, copy.bytes, copy.on_lost_node) == (True, whole, False)

    # A holder declared lost: its stripes no longer count, every shard still keeps k = 2.
    session.execute(update(Node).where(Node.id == nodes[3]).values(lost_at=NOW))
    assert totals() == (2, whole, 2)
    # A stripe of shard 0 found bad too: shard 0 keeps 1 < k, the copy is no longer whole.
    _stripe(session, cp, 0, 0, "corrupt")
    assert totals() == (0, whole, 2)
    copy = take_snapshot(session, job.name, TIERS, NOW).checkpoints[0].copies["coded"]
    assert (copy.verified, copy.on_lost_node) == (False, True)
    # A stripe being pulled again holds nothing yet.
    _stripe(session, cp, 0, 0, "pending")
    assert totals() == (0, whole - SIZES[0] // 2, 2)
    # An expired copy is not read at all.
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp.id, TierCopy.tier == "coded")
        .values(state="expired")
    )
    assert stripe_totals(session, job.id, ["ssd", "coded"], {cp.id: 2}) == {}


@pytest.mark.query_unit
def test_keep_last_on_a_coded_tier_expires_the_older_coded_copies(session: Session) -> None:
    nodes = _nodes(session)
    own = RetentionPolicy(
        name=f"coded-{uuid.uuid4().hex[:8]}",
        spec={"tiers": {"coded": {"keep_last": 1}, "ssd": {"keep_last": 3}}},
    )
    session.add(own)
    session.flush()
    job = job_row(session, policy_id=own.id)
    for step in (10, 20, 30):
        _coded_checkpoint(session, job, nodes, step)
    _, p = dry_run(session, job.name, TIERS, NOW)
    assert [(e.step, e.tier) for e in p.expiries] == [(10, "coded"), (20, "coded")]
    per_copy = sum(s // 2 for s in SIZES) * 3
    assert [(u.tier, u.bytes_now, u.bytes_after) for u in p.usage] == [
        ("ssd", 3 * sum(SIZES), 3 * sum(SIZES)),
        ("coded", 3 * per_copy, per_copy),
    ]
