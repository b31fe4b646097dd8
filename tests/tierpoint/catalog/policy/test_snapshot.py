"""The retention planner's snapshot of a job, and a dry run, against the real migrated catalog."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import job_row
from tests.helpers.planner_builders import TIERS
from tierpoint.catalog.models import (
    Checkpoint,
    Job,
    Node,
    Replica,
    RestoreLease,
    RetentionPolicy,
    Shard,
    TierCopy,
)
from tierpoint.catalog.policy.assigned import policy_for_job
from tierpoint.catalog.policy.snapshot import dry_run, take_snapshot
from tierpoint.errors import JobNotFound
from tierpoint.retention import (
    CheckpointInfo,
    ExpiryRule,
    KeepReason,
    Policy,
    plan,
)
from tierpoint.retention import models as planned
from tierpoint.states import TierState

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def _node(session: Session) -> str:
    node = f"n-{uuid.uuid4().hex[:8]}"
    session.add(Node(id=node, local_roots={}))
    return node


def _checkpoint(
    session: Session,
    job: Job,
    node: str,
    step: int,
    sizes: list[int],
    *,
    markers: dict[str, str],
    replicas: dict[str, list[tuple[str, int]]],
    **kw: object,
) -> Checkpoint:
    """`replicas[tier]` gives (state, bytes_done) per shard, in shard order."""
    cp = Checkpoint(
        job_id=job.id,
        step=step,
        created_at=NOW - timedelta(hours=100 - step),
        total_bytes=sum(sizes),
        shard_count=len(sizes),
        manifest_digest="0" * 64,
        **kw,
    )
    session.add(cp)
    session.flush()
    shards = [
        Shard(checkpoint_id=cp.id, ordinal=i, path=f"s{i}", size=size, node_id=node)
        for i, size in enumerate(sizes)
    ]
    session.add_all(shards)
    session.flush()
    for tier, state in markers.items():
        session.add(TierCopy(checkpoint_id=cp.id, tier=tier, job_id=job.id, step=step, state=state))
    for tier, states in replicas.items():
        for shard, (state, done) in zip(shards, states, strict=True):
            session.add(
                Replica(
                    shard_id=shard.id,
                    checkpoint_id=cp.id,
                    tier=tier,
                    node_id=node if tier == "ssd" else None,
                    state=state,
                    location=f"/x/{tier}/{shard.path}",
                    bytes_done=done,
                )
            )
    session.flush()
    return cp


@pytest.mark.query_unit
def test_snapshot_reads_markers_replicas_leases_pins_tags_and_quarantine(session: Session) -> None:
    """A unit test of the snapshot query over rows written by hand, a `lost` replica among them
    (no operator action declares a node lost yet)."""
    node = _node(session)
    job = job_row(session)
    c1 = _checkpoint(
        session,
        job,
        node,
        1,
        [10, 20],
        markers={
            "ssd": "restorable",
            "lustre": "restorable",
            "s3": "pending",
            "tape": "restorable",
        },
        replicas={
            "ssd": [("verified", 10), ("verified", 20)],
            "lustre": [("verified", 10), ("verified", 20)],
            "s3": [("copying", 5), ("pending", 0)],
            "tape": [("verified", 10), ("verified", 20)],
        },
        meta={"loss": 1.5},
    )
    c2 = _checkpoint(
        session,
        job,
        node,
        2,
        [10, 20],
        markers={"ssd": "restorable", "lustre": "failed"},
        replicas={
            "ssd": [("verified", 10), ("lost", 0)],
            "lustre": [("verified", 10), ("corrupt", 20)],
        },
        pinned=True,
        meta={"tags": ["best", 3]},
    )
    c3 = _checkpoint(
        session,
        job,
        node,
        3,
        [7],
        markers={"ssd": "restorable", "lustre": "expiring"},
        replicas={"ssd": [("verified", 7)], "lustre": [("expiring", 7)]},
        quarantine_reason="failed load reported by the job",
        meta={"tags": "keep"},
    )
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == c3.id, TierCopy.tier == "ssd")
        .values(quarantine_reason="bad read", quarantine_evidence=True)
    )
    c4 = _checkpoint(
        session,
        job,
        node,
        4,
        [5],
        markers={"ssd": "restorable"},
        replicas={"ssd": [("verified", 5)]},
    )
    # An expired copy holds nothing, whatever its replicas say (a stray one left verified is
    # not counted: the snapshot reads no replica of an expired copy).
    c5 = _checkpoint(
        session,
        job,
        node,
        5,
        [4, 6],
        markers={"ssd": "expired", "lustre": "restorable"},
        replicas={
            "ssd": [("expired", 4), ("verified", 6)],
            "lustre": [("verified", 4), ("verified", 6)],
        },
    )
    session.add_all(
        [
            RestoreLease(checkpoint_id=c3.id, expires_at=NOW + timedelta(minutes=5)),
            RestoreLease(checkpoint_id=c4.id, expires_at=NOW - timedelta(seconds=1)),
            RestoreLease(checkpoint_id=c4.id, expires_at=NOW + timedelta(hours=1), released_at=NOW),
        ]
    )
    other = job_row(session)
    _checkpoint(session, other, node, 1, [1], markers={"ssd": "restorable"}, replicas={})
    session.flush()

    snap = take_snapshot(session, job.name, TIERS, NOW)

    assert snap.job == job.name and snap.tiers == TIERS
    assert snap.checkpoints == (
        CheckpointInfo(
            id=c1.id,
            step=1,
            created_at=c1.created_at,
            total_bytes=30,
            copies={
                "ssd": planned.TierCopy(state=TierState.RESTORABLE, verified=True, bytes=30),
                "lustre": planned.TierCopy(state=TierState.RESTORABLE, verified=True, bytes=30),
                "s3": planned.TierCopy(state=TierState.PENDING, verified=False, bytes=5),
            },
        ),
        CheckpointInfo(
            id=c2.id,
            step=2,
            created_at=c2.created_at,
            total_bytes=30,
            pinned=True,
            tags=frozenset({"best"}),
            copies={
                "ssd": planned.TierCopy(state=TierState.RESTORABLE, verified=False, bytes=10),
                "lustre": planned.TierCopy(state=TierState.FAILED, verified=False, bytes=30),
            },
        ),
        CheckpointInfo(
            id=c3.id,
            step=3,
            created_at=c3.created_at,
            total_bytes=7,
            tags=frozenset({"keep"}),
            quarantined=True,
            leased=True,
            copies={
                # An operator's (evidence); the checkpoint's own quarantine is a job's.
                "ssd": planned.TierCopy(
                    state=TierState.RESTORABLE,
                    verified=True,
                    bytes=7,
                    quarantined=True,
                    evidence=True,
                ),
                "lustre": planned.TierCopy(state=TierState.EXPIRING, verified=False, bytes=7),
            },
        ),
        CheckpointInfo(
            id=c4.id,
            step=4,
            created_at=c4.created_at,
            total_bytes=5,
            copies={"ssd": planned.TierCopy(state=TierState.RESTORABLE, verified=True, bytes=5)},
        ),
        CheckpointInfo(
            id=c5.id,
            step=5,
            created_at=c5.created_at,
            total_bytes=10,
            copies={
                "ssd": planned.TierCopy(state=TierState.EXPIRED, verified=False, bytes=0),
                "lustre": planned.TierCopy(state=TierState.RESTORABLE, verified=True, bytes=10),
            },
        ),
    )

    # The snapshot feeds the planner as is.
    policy = Policy.from_spec({"kinds": {"local": {"keep_last": 0}}})
    p = plan(snap, policy, NOW)
    assert [(e.step, e.tier, e.rule) for e in p.expiries] == []
    assert [(u.step, u.tier) for u in p.unfinished] == [(3, "lustre")]
    reasons = {(k.step, k.tier): k.reasons for k in p.keeps}
    assert reasons[(1, "ssd")] == (KeepReason.IN_FLIGHT,)
    assert reasons[(4, "ssd")] == (KeepReason.AWAITING_DURABLE,)
    assert reasons[(1, "lustre")] == (KeepReason.IN_FLIGHT, KeepReason.KEEP_ALL)


def test_snapshot_of_unknown_job(session: Session) -> None:
    with pytest.raises(JobNotFound):
        take_snapshot(session, f"nope-{uuid.uuid4().hex}", TIERS, NOW)
    with pytest.raises(JobNotFound):
        policy_for_job(session, f"nope-{uuid.uuid4().hex}")


def test_expiry_rule_values_are_stable() -> None:
    # The API and events carry these strings.
    assert [r.value for r in ExpiryRule] == ["not_kept", "max_bytes"]


def test_dry_run_plans_with_the_jobs_policy(session: Session) -> None:
    node = _node(session)
    own = RetentionPolicy(
        name=f"own-{uuid.uuid4().hex[:8]}",
        spec={"kinds": {"local": {"keep_last": 1}}, "durable": {"keep_last": 1}},
    )
    session.add(own)
    session.flush()
    job = job_row(session, policy_id=own.id)
    everywhere = {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}
    verified = {t: [("verified", 8)] for t in everywhere}
    for step in (10, 20, 30):
        _checkpoint(session, job, node, step, [8], markers=everywhere, replicas=verified)
    assigned, p = dry_run(session, job.name, TIERS, NOW)
    assert assigned.policy_id == own.id
    assert [(e.step, e.tier) for e in p.expiries] == [
        (10, "ssd"),
        (20, "ssd"),
        (10, "s3"),
        (20, "s3"),
    ]
    assert [(u.tier, u.bytes_now, u.bytes_after) for u in p.usage] == [
        ("ssd", 24, 8),
        ("lustre", 24, 24),
        ("s3", 24, 8),
    ]
