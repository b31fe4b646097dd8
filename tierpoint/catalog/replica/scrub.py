"""Catalog side of the scrub: which verified replicas are due (oldest read first, through
`ix_replica_scrub_due`), what a batch reads, recording what it found good, and the per-tier totals
the API shows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, cast

from sqlalchemy import BigInteger, Float, String, Table, bindparam, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.models import (
    VERIFIED,
    Checkpoint,
    Job,
    Replica,
    ScrubStats,
    Shard,
    Stripe,
    TierReadStats,
)

_last_read = func.coalesce(Replica.scrubbed_at, Replica.verified_at)
_stripe_last_read = func.coalesce(Stripe.scrubbed_at, Stripe.verified_at)


@dataclass(frozen=True)
class ScrubTarget:
    replica_id: int
    checkpoint_id: int
    job: str
    step: int
    path: str
    size: int
    checksum: str | None
    node_id: str | None
    state: str
    branch: int = 1  # its checkpoint's branch: the directory the file is in


def due(
    session: Session,
    tier: str,
    node: str | None,
    min_age: timedelta,
    cutoff: datetime,
    budget: int,
    limit: int,
) -> tuple[list[int], int]:
    """Verified replicas of the tier (and node) last read before both `now - min_age` and
    `cutoff`, oldest first, as many as fit `budget` bytes (at least one) and `limit`."""
    q = (
        select(Replica.id, Shard.size)
        .join(Shard, Shard.id == Replica.shard_id)
        .where(
            Replica.tier == tier,
            Replica.state == VERIFIED,
            _last_read < func.least(func.now() - min_age, cutoff),
        )
        .order_by(_last_read, Replica.id)
        .limit(limit)
    )
    if node is not None:
        q = q.where(Replica.node_id == node)
    return within_budget(session.execute(q), budget)


def within_budget(rows: Iterable[tuple[int, int]], budget: int) -> tuple[list[int], int]:
    """The leading (id, size) rows whose sizes fit `budget` (always the first, so that one item
    larger than a budget is still read), and their total."""
    ids: list[int] = []
    total = 0
    for rid, size in rows:
        if ids and total + size > budget:
            break
        ids.append(rid)
        total += size
    return ids, total


def targets(session: Session, replica_ids: Sequence[int]) -> list[ScrubTarget]:
    rows = session.execute(
        select(
            Replica.id,
            Replica.checkpoint_id,
            Job.name,
            Checkpoint.step,
            Shard.path,
            Shard.size,
            Shard.checksum,
            Replica.node_id,
            Replica.state,
            Checkpoint.branch,
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .join(Checkpoint, Checkpoint.id == Replica.checkpoint_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Replica.id.in_(list(replica_ids)))
        .order_by(Replica.id)
    ).all()
    return [ScrubTarget(*r[:9], branch=r[9]) for r in rows]


_TOTALS = ("replicas", "stripes", "bytes", "corrupt", "lost")


def add_totals(session: Session, tier: str, **counts: Any) -> None:
    """Add to the tier's scrub totals (`_TOTALS`, and `last_scrubbed_at` when given)."""
    values = {"tier": tier, **dict.fromkeys(_TOTALS, 0), **counts}
    stmt = insert(ScrubStats).values(**values)
    set_: dict[str, Any] = {k: getattr(ScrubStats, k) + getattr(stmt.excluded, k) for k in _TOTALS}
    set_["updated_at"] = func.now()
    if "last_scrubbed_at" in counts:
        set_["last_scrubbed_at"] = stmt.excluded.last_scrubbed_at
    session.execute(stmt.on_conflict_do_update(index_elements=["tier"], set_=set_))


def record_good(
    session: Session, tier: str, replica_ids: Sequence[int], picked_at: datetime
) -> int:
    """scrubbed_at = now for replicas still verified, counted once per pick (a retried batch
    does not count a replica again). Returns the bytes newly counted."""
    if not replica_ids:
        return 0
    rows = session.execute(
        update(Replica)
        .where(
            Replica.id.in_(list(replica_ids)),
            Replica.state == VERIFIED,
            func.coalesce(Replica.scrubbed_at, Replica.verified_at) < picked_at,
        )
        .values(scrubbed_at=func.now())
        .returning(Replica.shard_id)
    ).all()
    if not rows:
        return 0
    size = session.scalar(
        select(func.coalesce(func.sum(Shard.size), 0)).where(Shard.id.in_([r[0] for r in rows]))
    )
    nbytes = int(size or 0)
    add_totals(session, tier, replicas=len(rows), bytes=nbytes, last_scrubbed_at=func.now())
    return nbytes


def record_identities(session: Session, identities: Mapping[int, str]) -> None:
    """Which file each replica read back good is (replica id -> identity token), for the ones
    still verified: a replica recorded before identities were, or one whose file was put back
    by hand, gets the identity that expiry will check (`tierpoint/storage/posix/identity.py`)."""
    if not identities:
        return
    table = Replica.__table__
    assert isinstance(table, Table)
    session.connection().execute(
        update(table)
        .where(table.c.id == bindparam("rid"), table.c.state == VERIFIED)
        .values(file_identity=bindparam("identity")),
        [{"rid": rid, "identity": token} for rid, token in identities.items()],
    )


def record_reads(session: Session, tier: str, nbytes: int, seconds: float) -> None:
    """Add whole-replica reads off `tier` (unthrottled, so they measure the device, not a
    limit) to the tier's read throughput."""
    if nbytes <= 0 or seconds <= 0:
        return
    stmt = insert(TierReadStats).values(tier=tier, bytes=nbytes, seconds=seconds)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["tier"],
            set_={
                "bytes": TierReadStats.bytes + stmt.excluded.bytes,
                "seconds": TierReadStats.seconds + stmt.excluded.seconds,
                "updated_at": func.now(),
            },
        )
    )


@cache
def _add_reads_unless_busy() -> Any:
    """The tier's row locked SKIP LOCKED and added to in one statement, with whether the row
    exists; built once. Bind names are not column names: an UPDATE takes those as SET values."""
    table = cast(Table, TierReadStats.__table__)
    tier = bindparam("read_tier", type_=String)
    target = (
        select(table.c.tier).where(table.c.tier == tier).with_for_update(skip_locked=True)
    ).cte("target")
    added = (
        update(table)
        .where(table.c.tier == target.c.tier)
        .values(
            bytes=table.c.bytes + bindparam("read_bytes", type_=BigInteger),
            seconds=table.c.seconds + bindparam("read_seconds", type_=Float),
            updated_at=func.now(),
        )
        .returning(table.c.tier)
        .cte("added")
    )
    return select(
        select(func.count()).select_from(added).scalar_subquery().label("added"),
        exists().where(table.c.tier == tier).label("present"),
    )


def add_reads_unless_busy(session: Session, tier: str, nbytes: int, seconds: float) -> bool:
    """`record_reads` without waiting: False, and nothing written, when another transaction
    holds the tier's row. Every batch of every node ends by adding its reads to that one row,
    in the transaction that records its events: waiting for it put those transactions in one
    queue (at 1,000 nodes, 950 of Postgres' 960 s of statement time in a checkpoint)."""
    if nbytes <= 0 or seconds <= 0:
        return True
    params = {"read_tier": tier, "read_bytes": nbytes, "read_seconds": seconds}
    row = session.execute(_add_reads_unless_busy(), params).one()
    if row.added:
        return True
    if not row.present:
        # The tier's first read: its row is inserted (a first read elsewhere may be inserting it).
        record_reads(session, tier, nbytes, seconds)
        return True
    return False


def read_throughput(session: Session, tiers: Sequence[str]) -> dict[str, float]:
    """Tier -> bytes per second its recorded reads achieved (tiers never read: absent)."""
    rows = session.execute(
        select(TierReadStats.tier, TierReadStats.bytes, TierReadStats.seconds).where(
            TierReadStats.tier.in_(list(tiers)), TierReadStats.seconds > 0
        )
    )
    return {r.tier: r.bytes / r.seconds for r in rows}


def record_bad(session: Session, tier: str, corrupt: int, lost: int) -> None:
    if corrupt or lost:
        add_totals(session, tier, corrupt=corrupt, lost=lost)


@dataclass(frozen=True)
class TierScrubView:
    tier: str
    replicas: int
    bytes: int
    corrupt: int
    lost: int
    last_scrubbed_at: datetime | None
    # the verified replica (or stripe, on a coded tier) read longest ago (its last verification
    # or scrub): how far behind
    oldest_read_at: datetime | None
    stripes: int = 0


def overview(session: Session, tiers: Sequence[str]) -> list[TierScrubView]:
    stats = {
        s.tier: s
        for s in (session.execute(select(ScrubStats).where(ScrubStats.tier.in_(tiers))))
        .scalars()
        .all()
    }
    out = []
    for tier in tiers:
        oldest = session.scalar(
            select(_last_read)
            .where(Replica.tier == tier, Replica.state == VERIFIED)
            .order_by(_last_read)
            .limit(1)
        )
        # A coded tier keeps stripes, not replicas.
        oldest = oldest or session.scalar(
            select(_stripe_last_read)
            .where(Stripe.tier == tier, Stripe.state == VERIFIED)
            .order_by(_stripe_last_read)
            .limit(1)
        )
        st = stats.get(tier)
        out.append(
            TierScrubView(
                tier,
                st.replicas if st else 0,
                st.bytes if st else 0,
                st.corrupt if st else 0,
                st.lost if st else 0,
                st.last_scrubbed_at if st else None,
                oldest,
                st.stripes if st else 0,
            )
        )
    return out


def checkpoint_replicas(
    session: Session, checkpoint_id: int, tier: str, after_id: int, limit: int
) -> list[tuple[int, str | None]]:
    """The checkpoint's verified replicas on the tier after `after_id`: (id, node), by id."""
    rows = session.execute(
        select(Replica.id, Replica.node_id)
        .where(
            Replica.checkpoint_id == checkpoint_id,
            Replica.tier == tier,
            Replica.state == VERIFIED,
            Replica.id > after_id,
        )
        .order_by(Replica.id)
        .limit(limit)
    ).all()
    return [(rid, node) for rid, node in rows]
