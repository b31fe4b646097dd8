"""Reading what the retention planner needs from the catalog: one job's checkpoints, their copies
on each tier with their replicas' totals (a coded peer tier's, its stripes'), and leases (the
policy: `assigned.py`).

Six indexed queries per job, whatever the number of shards. For a snapshot consistent across them
(the executor's case), run in a REPEATABLE READ transaction; the executor must still re-check each
expiry when it flips the tier copy, since pins and leases can arrive after the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, exists, func, select
from sqlalchemy.orm import Session, aliased

from tierpoint.catalog.job.lookup import require_job_id
from tierpoint.catalog.models import (
    RESTORABLE,
    Checkpoint,
    Job,
    Node,
    Replica,
    RestoreLease,
    Shard,
    TierCopy,
)
from tierpoint.catalog.policy.assigned import AssignedPolicy, policy_for_job
from tierpoint.catalog.policy.stripe_totals import stripe_totals
from tierpoint.retention import models as planned
from tierpoint.retention.models import CheckpointInfo, RetentionPlan, RetentionSnapshot
from tierpoint.retention.planner import plan
from tierpoint.retention.policy import TierRef
from tierpoint.states import ReplicaState, TierState


def _tags(meta: dict[str, Any]) -> frozenset[str]:
    tags = meta.get("tags")
    if isinstance(tags, str):
        return frozenset({tags})
    if isinstance(tags, list | tuple):
        return frozenset(t for t in tags if isinstance(t, str))
    return frozenset()


# Bytes a replica occupies on its tier: whole shards once written, progress while copying.
_WHOLE = (ReplicaState.VERIFIED, ReplicaState.CORRUPT, ReplicaState.EXPIRING)
_PARTIAL = (ReplicaState.PENDING, ReplicaState.COPYING)


def take_snapshot(
    session: Session, job: str, tiers: Sequence[TierRef], now: datetime
) -> RetentionSnapshot:
    """The job's checkpoints with their copies on the configured tiers (copies on other tiers
    are left out). A lease counts if it is unreleased and expires after `now`. Raises
    JobNotFound."""
    job_id = require_job_id(session, job)
    names = [t.name for t in tiers]
    checkpoints = _checkpoints(session, job_id, now)
    copies = _copies(session, job_id, names, {c.id: c.shard_count for c in checkpoints}, now)
    return RetentionSnapshot(
        job=job,
        tiers=tuple(TierRef(t.name, t.kind) for t in tiers),
        checkpoints=tuple(
            CheckpointInfo(
                id=c.id,
                step=c.step,
                created_at=c.created_at,
                total_bytes=c.total_bytes,
                pinned=c.pinned,
                tags=_tags(c.meta),
                quarantined=c.quarantine_reason is not None,
                evidence=c.quarantine_reason is not None and c.quarantine_evidence,
                leased=bool(c.leased),
                copies=copies.get(c.id, {}),
                superseded=c.superseded_by is not None,
                good=c.health == "good",
                child_needs=bool(c.child_needs),
            )
            for c in checkpoints
        ),
    )


def _child_needs() -> Any:
    """A job forked from the checkpoint has no restorable checkpoint of its own yet: its first
    restore reads this one where it is (docs/timeline.md)."""
    child = aliased(Job, name="child")
    own = aliased(Checkpoint, name="own")
    has_own = exists().where(
        own.job_id == child.id,
        own.deleted_at.is_(None),
        own.quarantine_reason.is_(None),
        exists().where(TierCopy.checkpoint_id == own.id, TierCopy.state == RESTORABLE),
    )
    return exists().where(child.fork_parent_id == Checkpoint.id, ~has_own)


def _checkpoints(session: Session, job_id: int, now: datetime) -> Sequence[Any]:
    active_lease = exists().where(
        RestoreLease.checkpoint_id == Checkpoint.id,
        RestoreLease.released_at.is_(None),
        RestoreLease.expires_at > now,
    )
    return session.execute(
        select(
            Checkpoint.id,
            Checkpoint.step,
            Checkpoint.created_at,
            Checkpoint.total_bytes,
            Checkpoint.shard_count,
            Checkpoint.pinned,
            Checkpoint.meta,
            Checkpoint.quarantine_reason,
            Checkpoint.quarantine_evidence,
            active_lease.label("leased"),
            Checkpoint.superseded_by,
            Checkpoint.health,
            _child_needs().label("child_needs"),
        )
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.step, Checkpoint.id)
    ).all()


def _copies(
    session: Session,
    job_id: int,
    names: Sequence[str],
    shard_counts: dict[int, int],
    now: datetime,
) -> dict[int, dict[str, planned.TierCopy]]:
    """checkpoint id -> tier -> its copy there, from the tier copies and their replicas' totals. A
    rebuild's hold on its sources counts until its `rebuild_until`, as a lease until it expires."""
    tier_copies = session.execute(
        select(
            TierCopy.checkpoint_id,
            TierCopy.tier,
            TierCopy.state,
            TierCopy.quarantine_reason,
            TierCopy.quarantine_evidence,
            TierCopy.rebuild_from,
            TierCopy.rebuild_until,
        ).where(TierCopy.job_id == job_id, TierCopy.tier.in_(names))
    ).all()
    replica_totals = _replica_totals(session, job_id, names)
    # A coded copy has stripes, not replicas: it is whole while every shard keeps k of them.
    replica_totals |= stripe_totals(session, job_id, names, shard_counts)
    copies: dict[int, dict[str, planned.TierCopy]] = {}
    for m in tier_copies:
        verified, nbytes, on_lost = replica_totals.get((m.checkpoint_id, m.tier), (0, 0, 0))
        copies.setdefault(m.checkpoint_id, {})[m.tier] = planned.TierCopy(
            state=TierState(m.state),
            verified=verified >= shard_counts.get(m.checkpoint_id, 0) > 0,
            bytes=nbytes,
            quarantined=m.quarantine_reason is not None,
            evidence=m.quarantine_reason is not None and m.quarantine_evidence,
            on_lost_node=on_lost > 0,
            # guard: snapshot-reads-rebuild-hold
            rebuild_from=frozenset(m.rebuild_from or ())
            if m.rebuild_until is not None and m.rebuild_until > now
            else frozenset(),
        )
    return copies


def _replica_totals(
    session: Session, job_id: int, names: Sequence[str]
) -> dict[tuple[int, str], tuple[int, int, int]]:
    """(checkpoint id, tier) -> (verified replicas, bytes stored, replicas on a node declared
    lost)."""
    stored = case(
        (Replica.state.in_([s.value for s in _WHOLE]), Shard.size),
        (Replica.state.in_([s.value for s in _PARTIAL]), Replica.bytes_done),
        else_=0,
    )
    # Only copies that are not expired: an expired copy holds nothing and can never be restored,
    # and a long job's history is mostly expired copies, whose replicas a pass would otherwise
    # read every time. The unexpired tier copies are found through ix_checkpoint_tier_latest and
    # their replicas through ix_replica_checkpoint_tier_state.
    unexpired = TierCopy
    totals = session.execute(
        select(
            Replica.checkpoint_id,
            Replica.tier,
            func.count().filter(Replica.state == ReplicaState.VERIFIED.value).label("verified"),
            func.coalesce(func.sum(stored), 0).label("bytes"),
            func.count().filter(Node.lost_at.is_not(None)).label("on_lost"),
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .outerjoin(Node, Node.id == Replica.node_id)
        .join(
            unexpired,
            (unexpired.checkpoint_id == Replica.checkpoint_id) & (unexpired.tier == Replica.tier),
        )
        .where(
            unexpired.job_id == job_id,
            unexpired.tier.in_(names),
            unexpired.state != TierState.EXPIRED.value,
        )
        .group_by(Replica.checkpoint_id, Replica.tier)
    ).all()
    return {
        (r.checkpoint_id, r.tier): (int(r.verified), int(r.bytes), int(r.on_lost)) for r in totals
    }


def dry_run(
    session: Session, job: str, tiers: Sequence[TierRef], now: datetime
) -> tuple[AssignedPolicy, RetentionPlan]:
    """What retention would do to the job now, under the policy that applies to it. From an
    AsyncSession: `await session.run_sync(dry_run, job, tiers, now)`. Raises JobNotFound."""
    assigned = policy_for_job(session, job)
    return assigned, plan(take_snapshot(session, job, tiers, now), assigned.policy, now)
