"""job_tier_usage, the running totals the jobs overview reads, stays equal to the sum over the
restorable and expiring markers through every change a marker goes through: registration,
promotion, failure, retention, a marker's delete, a checkpoint's delete (its markers cascade)."""

from __future__ import annotations

import uuid

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Checkpoint, Job, JobTierUsage, TierCopy

TIERS = ("ssd", "lustre", "s3")

# The same totals recomputed from the markers.
RECOMPUTED = text(
    "SELECT ct.job_id, ct.tier, sum(c.total_bytes), count(*) "
    "FROM checkpoint_tier ct JOIN checkpoint c ON c.id = ct.checkpoint_id "
    "WHERE ct.state IN ('restorable', 'expiring') AND ct.job_id = :job "
    "GROUP BY ct.job_id, ct.tier"
)


def totals(s: Session, job_id: int) -> dict[str, tuple[int, int]]:
    s.flush()
    kept = {
        u.tier: (u.bytes, u.checkpoints)
        for u in s.execute(select(JobTierUsage).where(JobTierUsage.job_id == job_id)).scalars()
        if u.checkpoints != 0 or u.bytes != 0
    }
    recomputed = {r[1]: (int(r[2]), int(r[3])) for r in s.execute(RECOMPUTED, {"job": job_id})}
    assert kept == recomputed
    return kept


def register(s: Session, job_id: int, step: int, nbytes: int) -> int:
    cid: int = s.execute(
        insert(Checkpoint)
        .values(
            job_id=job_id,
            step=step,
            total_bytes=nbytes,
            shard_count=1,
            manifest_digest=uuid.uuid4().hex * 2,
        )
        .returning(Checkpoint.id)
    ).scalar_one()
    s.execute(
        insert(TierCopy),
        [{"checkpoint_id": cid, "tier": t, "job_id": job_id, "step": step} for t in TIERS],
    )
    return cid


def flip(s: Session, cid: int, tier: str, state: str) -> None:
    s.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cid, TierCopy.tier == tier)
        .values(state=state)
    )


def test_totals_follow_every_marker_change(session: Session) -> None:
    s = session
    job_id: int = s.execute(
        insert(Job).values(name=f"usage-{uuid.uuid4().hex[:8]}").returning(Job.id)
    ).scalar_one()
    a = register(s, job_id, 100, 1000)
    b = register(s, job_id, 200, 50)
    assert totals(s, job_id) == {}  # pending holds nothing

    for t in TIERS:
        flip(s, a, t, "restorable")
    flip(s, b, "ssd", "restorable")
    flip(s, b, "s3", "failed")
    assert totals(s, job_id) == {"ssd": (1050, 2), "lustre": (1000, 1), "s3": (1000, 1)}

    # Restorable -> expiring still holds the bytes; expiring -> expired frees them.
    flip(s, a, "ssd", "expiring")
    assert totals(s, job_id)["ssd"] == (1050, 2)
    flip(s, a, "ssd", "expired")
    assert totals(s, job_id)["ssd"] == (50, 1)
    # An update that leaves the state as it was (or changes another column) counts nothing.
    flip(s, b, "ssd", "restorable")
    s.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == b, TierCopy.tier == "ssd")
        .values(quarantine_reason="suspect")
    )
    assert totals(s, job_id)["ssd"] == (50, 1)

    s.execute(delete(TierCopy).where(TierCopy.checkpoint_id == a, TierCopy.tier == "lustre"))
    assert "lustre" not in totals(s, job_id)

    # The checkpoint's delete cascades to its markers: its held bytes leave the totals once.
    s.execute(delete(Checkpoint).where(Checkpoint.id == a))
    assert totals(s, job_id) == {"ssd": (50, 1)}
    s.execute(delete(Checkpoint).where(Checkpoint.id == b))
    assert totals(s, job_id) == {}

    # A job's delete takes its totals with it.
    c = register(s, job_id, 300, 7)
    flip(s, c, "s3", "restorable")
    assert totals(s, job_id) == {"s3": (7, 1)}
    s.execute(delete(Job).where(Job.id == job_id))
    s.flush()
    assert s.execute(select(JobTierUsage).where(JobTierUsage.job_id == job_id)).first() is None
