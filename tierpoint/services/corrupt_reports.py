"""A reader's report that a copy it read did not match its registered checksum.

The server does not take the reader's word for it: a read can fail for the reader's own reasons
(its memory, its network, a bug), and marking the only good copy of a checkpoint corrupt on a
false report would make it unrestorable. So the report re-reads that one replica on the right
queue (`VerifyReplicas`, the scrub's own read-back activity) and only a confirmed mismatch marks
it corrupt, demotes its tier and starts the repair. Reports of one replica share one verification
run, a replica read back good within RECHECK_AFTER is not read again, and a replica already marked
is left as it is: reporting the same copy again changes nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from tierpoint import logs
from tierpoint.catalog.events import EventKind, arecord
from tierpoint.catalog.models import Checkpoint, CheckpointTier, Job, Replica, Shard
from tierpoint.config import Settings, TierKind
from tierpoint.contract.integrity import ScrubBatchResult, VerifyInput
from tierpoint.errors import CheckpointNotFound, CopyNotFound, JobNotFound, TemporalUnavailable
from tierpoint.states import ReplicaState
from tierpoint.temporal import start_verify

log = logs.get(__name__)

# How long the request waits for the re-read before it answers "running".
REPORT_WAIT = 20.0
RECHECK_AFTER = timedelta(minutes=1)


@dataclass(frozen=True)
class CopyRef:
    checkpoint_id: int
    job_id: int
    shard_id: int
    replica_id: int
    node: str | None
    state: str
    recently_read: bool


async def find_copy(
    session: AsyncSession, settings: Settings, job: str, step: int, tier: str, path: str
) -> CopyRef:
    cp = (
        await session.execute(
            select(Checkpoint.id, Checkpoint.job_id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
    ).one_or_none()
    if cp is None:
        if await session.scalar(select(Job.id).where(Job.name == job)) is None:
            raise JobNotFound(f"no job named {job!r}")
        raise CheckpointNotFound(f"job {job!r} has no checkpoint at step {step}")
    if tier not in settings.tier_names():
        raise CopyNotFound(f"tier {tier!r} is not configured")
    row = (
        await session.execute(
            select(
                Shard.id,
                Replica.id,
                Replica.node_id,
                Replica.state,
                Replica.scrubbed_at > func.now() - RECHECK_AFTER,
            )
            .outerjoin(Replica, and_(Replica.shard_id == Shard.id, Replica.tier == tier))
            .where(Shard.checkpoint_id == cp.id, Shard.path == path)
        )
    ).one_or_none()
    if row is None:
        raise CopyNotFound(f"{job}/{step} has no shard {path!r}")
    if row[1] is None:
        raise CopyNotFound(f"{job}/{step}: {path!r} has no copy on tier {tier!r}")
    return CopyRef(cp.id, cp.job_id, row[0], row[1], row[2], row[3], bool(row[4]))


async def _answer(
    session: AsyncSession, ref: CopyRef, tier: str, verification: str
) -> dict[str, Any]:
    state = await session.scalar(select(Replica.state).where(Replica.id == ref.replica_id))
    marker = await session.scalar(
        select(CheckpointTier.state).where(
            CheckpointTier.checkpoint_id == ref.checkpoint_id, CheckpointTier.tier == tier
        )
    )
    sources = await session.scalar(
        select(func.count()).where(
            Replica.shard_id == ref.shard_id,
            Replica.tier != tier,
            Replica.state == ReplicaState.VERIFIED.value,
        )
    )
    if state in (ReplicaState.CORRUPT.value, ReplicaState.LOST.value):
        repair = "started" if sources else "no verified source"
    elif state in (ReplicaState.PENDING.value, ReplicaState.COPYING.value):
        repair = "running"  # a repair is copying it back already
    elif verification == "running":
        repair = "pending"
    else:
        repair = "not needed"
    return {
        "replica_state": state,
        "marker_state": marker,
        "repair": repair,
        "verification": verification,
    }


async def report_corrupt_copy(
    sessions: async_sessionmaker[AsyncSession],
    client: Client | None,
    settings: Settings,
    job: str,
    step: int,
    tier: str,
    path: str,
    reason: str,
    actor: str,
) -> dict[str, Any]:
    async with sessions() as session:
        ref = await find_copy(session, settings, job, step, tier, path)
        if ref.state != ReplicaState.VERIFIED.value:
            return await _answer(session, ref, tier, f"already {ref.state}")
        if ref.recently_read:
            return await _answer(session, ref, tier, "recently read back good")
        if client is None:
            raise TemporalUnavailable("cannot re-read the copy now: Temporal is unreachable")
        await arecord(
            session,
            EventKind.CORRUPT_REPORTED,
            checkpoint_id=ref.checkpoint_id,
            job_id=ref.job_id,
            tier=tier,
            actor=actor,
            detail={"path": path, "reason": reason[:1000]},
        )
        await session.commit()
    node = ref.node if settings.tier(tier).kind is TierKind.LOCAL else None
    wid = await start_verify(
        client, VerifyInput(tier=tier, node=node, replica_ids=[ref.replica_id], actor="report")
    )
    verification = "running"
    try:
        res: ScrubBatchResult = await asyncio.wait_for(
            client.get_workflow_handle(wid, result_type=ScrubBatchResult).result(), REPORT_WAIT
        )
        verification = "confirmed" if (res.corrupt or res.lost) else "not confirmed"
    except TimeoutError:
        log.info("re-read of a reported copy still running", workflow_id=wid)
    async with sessions() as session:
        return await _answer(session, ref, tier, verification)
