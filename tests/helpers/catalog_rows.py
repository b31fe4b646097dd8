"""Rows written straight into a real catalog for the catalog's own tests: jobs, checkpoints,
shards, replicas and tier copies in the states a test needs, through the catalog's writers where
it has them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import NODES, Seeded, random_shards, seed_checkpoint
from tierpoint.catalog.models import (
    Checkpoint,
    Job,
    Node,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.config import Settings
from tierpoint.states import ReplicaState


def one_shard_checkpoint(session: Session, node: str) -> tuple[int, int]:
    """(checkpoint id, shard id) of a one-shard checkpoint on `node` with a pending ssd marker."""
    upsert_node(session, node, {})
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=1, total_bytes=10, shard_count=1, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    shard = session.scalar(
        insert(Shard)
        .values(checkpoint_id=cp, ordinal=0, path="a", size=10, checksum="0badf00d", node_id=node)
        .returning(Shard.id)
    )
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="ssd", job_id=job_id, step=1))
    assert cp is not None and shard is not None
    return cp, shard


def declare_lost(session: Session, node: str) -> None:
    session.execute(update(Node).where(Node.id == node).values(lost_at=func.now()))


def write_replica(session: Session, cp: int, shard: int, node: str, state: ReplicaState) -> None:
    w = ReplicaWrite(shard, state, f"/ssd/{node}/a", node, bytes_done=10)
    upsert_replicas(session, cp, "ssd", [w])


def replica_state(session: Session, shard: int) -> str | None:
    return session.scalar(select(Replica.state).where(Replica.shard_id == shard))


SHARDS = 6


def checkpoint_of_shards(session: Session, node: str) -> tuple[int, list[int]]:
    """(checkpoint id, shard ids by ordinal) of a checkpoint of SHARDS shards on `node`."""
    upsert_node(session, node, {})
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    cp = session.scalar(
        insert(Checkpoint)
        .values(
            job_id=job_id, step=1, total_bytes=10 * SHARDS, shard_count=SHARDS, manifest_digest="d"
        )
        .returning(Checkpoint.id)
    )
    assert cp is not None
    ids = [
        session.scalar(
            insert(Shard)
            .values(
                checkpoint_id=cp,
                ordinal=i,
                path=f"s{i}",
                size=10,
                checksum=f"{i:08x}",
                node_id=node,
            )
            .returning(Shard.id)
        )
        for i in range(SHARDS)
    ]
    return cp, [i for i in ids if i is not None]


def replicas_on(session: Session, tier: str, shards: list[int]) -> dict[int, Replica]:
    found = session.scalars(
        select(Replica).where(Replica.tier == tier, Replica.shard_id.in_(shards))
    )
    return {r.shard_id: r for r in found}


def lustre_write(shard: int, state: ReplicaState, node: str, done: int = 10) -> ReplicaWrite:
    return ReplicaWrite(shard, state, f"/lustre/s{shard}", node, bytes_done=done)


SEEDED_TIERS = ("ssd", "lustre", "s3")


def verified_everywhere(
    settings: Settings, sessions: sessionmaker[Session], job: str, step: int, age_days: int = 1
) -> Seeded:
    """A checkpoint whose catalog says it is verified and restorable on every tier."""
    seeded = seed_checkpoint(settings, sessions, job, step, random_shards(NODES, 2, 100))
    with sessions.begin() as s:
        shards = s.execute(
            select(Shard.id, Shard.node_id, Shard.path).where(
                Shard.checkpoint_id == seeded.checkpoint_id
            )
        ).all()
        s.execute(
            insert(Replica),
            [
                {
                    "shard_id": sid,
                    "checkpoint_id": seeded.checkpoint_id,
                    "tier": t,
                    "node_id": node if t == "ssd" else None,
                    "state": "verified",
                    "location": f"{t}:{path}",
                    "bytes_done": 100,
                    "verified_at": datetime.now(UTC) - timedelta(days=age_days),
                }
                for sid, node, path in shards
                for t in SEEDED_TIERS
            ],
        )
        job_id = s.scalar(select(Checkpoint.job_id).where(Checkpoint.id == seeded.checkpoint_id))
        s.execute(
            insert(TierCopy),
            [
                {
                    "checkpoint_id": seeded.checkpoint_id,
                    "tier": t,
                    "job_id": job_id,
                    "step": step,
                    "state": "restorable",
                }
                for t in SEEDED_TIERS
            ],
        )
    return seeded


def replica_ids(sessions: sessionmaker[Session], cp: int, tier: str) -> list[int]:
    with sessions.begin() as s:
        return list(
            s.scalars(
                select(Replica.id)
                .join(Shard, Shard.id == Replica.shard_id)
                .where(Replica.checkpoint_id == cp, Replica.tier == tier)
                .order_by(Shard.ordinal)
            )
        )


def tier_copy_states(sessions: sessionmaker[Session], cp: int) -> dict[str, str]:
    with sessions.begin() as s:
        return dict(
            s.execute(
                select(TierCopy.tier, TierCopy.state).where(TierCopy.checkpoint_id == cp)
            ).all()
        )


def job_row(session: Session, policy_id: int | None = None) -> Job:
    job = Job(name=f"job-{uuid.uuid4().hex[:10]}", policy_id=policy_id)
    session.add(job)
    session.flush()
    return job


def checkpoint_row(
    session: Session, job_id: int, step: int, tiers: tuple[str, ...] = ("ssd",), branch: int = 1
) -> int:
    """A checkpoint of `job_id` at `step` on `branch`, with no shards and a pending tier copy on
    each of `tiers`; returns its id."""
    cp: int | None = session.scalar(
        insert(Checkpoint)
        .values(
            job_id=job_id,
            step=step,
            branch=branch,
            total_bytes=0,
            shard_count=0,
            manifest_digest=f"d{step}",
        )
        .returning(Checkpoint.id)
    )
    assert cp is not None
    for tier in tiers:
        session.execute(
            insert(TierCopy).values(checkpoint_id=cp, tier=tier, job_id=job_id, step=step)
        )
    return cp
