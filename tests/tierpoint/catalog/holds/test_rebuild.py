"""A rebuild's hold on its sources, against the real migrated catalog: the snapshot gives it to
the planner until it lapses, retention's re-check under locks refuses an expiry planned from a
snapshot taken before the hold, and the rebuilt tier's promotion (made or given up) releases it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.holds.rebuild import REBUILD_HOLD, hold_sources
from tierpoint.catalog.locks import RowLock, lock_checkpoint
from tierpoint.catalog.models import (
    Checkpoint,
    Job,
    Node,
    Replica,
    RetentionPolicy,
    Shard,
    TierCopy,
)
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.catalog.tier_copy.expiry import begin_expiry, plan_expiries
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.contract.retention import BeginState
from tierpoint.retention.policy import Policy, TierRef
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

TIERS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("peer", TierKind.PEER),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
# Step 1 is wanted off every tier but S3 once step 2 is there.
POLICY = Policy.from_spec(
    {"kinds": {"local": {"keep_last": 1}, "peer": {"keep_last": 1}, "shared": {"keep_last": 1}}}
)


def _job(session: Session) -> Job:
    pol = RetentionPolicy(name=f"rebuild-{uuid.uuid4().hex[:8]}", spec=POLICY.to_spec())
    session.add(pol)
    session.flush()
    job = Job(name=f"job-{uuid.uuid4().hex[:10]}", policy_id=pol.id)
    session.add(job)
    session.flush()
    return job


def _checkpoint(session: Session, job: Job, step: int, peer_state: str, now: datetime) -> int:
    """Two shards of a node that is lost, and of its peer copy's holder (lost too, for step 1):
    the peer copy of step 1 failed; every other copy is restorable."""
    lost, holder = f"n-{uuid.uuid4().hex[:8]}", f"h-{uuid.uuid4().hex[:8]}"
    session.add_all(
        [
            Node(id=lost, local_roots={}, lost_at=now),
            Node(id=holder, local_roots={}, lost_at=now if peer_state == "failed" else None),
        ]
    )
    cp = Checkpoint(
        job_id=job.id,
        step=step,
        created_at=now - timedelta(hours=10 - step),
        total_bytes=20,
        shard_count=2,
        manifest_digest="0" * 64,
    )
    session.add(cp)
    session.flush()
    shards = [
        Shard(checkpoint_id=cp.id, ordinal=i, path=f"s{i}", size=10, node_id=lost) for i in range(2)
    ]
    session.add_all(shards)
    session.flush()
    states = {"ssd": "restorable", "peer": peer_state, "lustre": "restorable", "s3": "restorable"}
    for tier, state in states.items():
        session.add(TierCopy(checkpoint_id=cp.id, tier=tier, job_id=job.id, step=step, state=state))
        for sh in shards:
            node = lost if tier == "ssd" else holder if tier == "peer" else None
            replica_state = "lost" if state == "failed" else "verified"
            session.add(
                Replica(
                    shard_id=sh.id,
                    checkpoint_id=cp.id,
                    tier=tier,
                    node_id=node,
                    state=replica_state,
                    location=f"/x/{tier}/{sh.path}",
                    bytes_done=10,
                )
            )
    session.flush()
    return cp.id


def _state(session: Session, cid: int, tier: str) -> str:
    return session.scalars(
        select(TierCopy.state).where(TierCopy.checkpoint_id == cid, TierCopy.tier == tier)
    ).one()


def test_the_recheck_refuses_an_expiry_of_a_source_held_since_the_plan(session: Session) -> None:
    now = datetime.now(UTC)
    job = _job(session)
    one = _checkpoint(session, job, 1, "failed", now)
    _checkpoint(session, job, 2, "restorable", now)

    # Retention's plan, before re-replication planned: step 1's lustre copy is to go.
    stale = plan_expiries(session, job.name, TIERS, now, limit=50)
    assert (one, "lustre") in {(t.checkpoint_id, t.tier) for t in stale.tasks}

    # Re-replication plans: the lost node's shards are read from lustre.
    assert lock_checkpoint(session, one, RowLock.NO_KEY_UPDATE)
    hold_sources(session, one, "peer", ["lustre"], now)
    begun = begin_expiry(session, job.name, one, "lustre", TIERS, now)
    assert begun.state is BeginState.SKIPPED
    assert "rebuild_source" in (begun.reason or "")
    assert _state(session, one, "lustre") == TierState.RESTORABLE.value

    # The failed peer copy being made again is in flight: not retention's while the hold lasts.
    assert begin_expiry(session, job.name, one, "peer", TIERS, now).state is BeginState.SKIPPED

    # Given up (promoted failed): the hold is released and the copy is retention's again.
    outcome = promote(session, one, "peer", [], "no live node to hold a copy")
    assert outcome.state == TierState.FAILED.value
    marker = session.scalars(
        select(TierCopy).where(TierCopy.checkpoint_id == one, TierCopy.tier == "peer")
    ).one()
    session.refresh(marker)
    assert (marker.rebuild_from, marker.rebuild_until) == (None, None)
    assert begin_expiry(session, job.name, one, "lustre", TIERS, now).state is BeginState.EXPIRING


def test_the_snapshot_gives_a_hold_until_it_lapses(session: Session) -> None:
    now = datetime.now(UTC)
    job = _job(session)
    one = _checkpoint(session, job, 1, "failed", now)
    hold_sources(session, one, "peer", ["lustre", "s3", "peer"], now)

    def held(at: datetime) -> frozenset[str]:
        snap = take_snapshot(session, job.name, TIERS, at)
        return snap.checkpoints[0].copies["peer"].rebuild_from

    assert held(now) == {"lustre", "s3"}  # never its own tier
    assert held(now + REBUILD_HOLD - timedelta(seconds=1)) == {"lustre", "s3"}
    assert held(now + REBUILD_HOLD) == frozenset()
