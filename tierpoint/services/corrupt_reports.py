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

from temporalio.client import Client

from tierpoint import logs
from tierpoint.catalog.engine import AsyncSessions
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.reads.copies import (
    CopyState,
    copy_state,
    find_copy,
    find_stripe,
    stripe_state,
)
from tierpoint.config import Settings
from tierpoint.contract.integrity import ScrubBatchResult, VerifyInput
from tierpoint.errors import CopyNotFound, TemporalUnavailable
from tierpoint.states import ReplicaState
from tierpoint.temporal import start_verify

log = logs.get(__name__)

# How long the request waits for the re-read before it answers "running".
REPORT_WAIT = 20.0
RECHECK_AFTER = timedelta(minutes=1)


def _answer(now: CopyState, verification: str, stripe: bool = False) -> dict[str, Any]:
    if stripe:
        # A stripe is made again by a rebuild, never copied back by a repair.
        repair = "not needed"
    elif now.replica in (ReplicaState.CORRUPT.value, ReplicaState.LOST.value):
        repair = "started" if now.sources else "no verified source"
    elif now.replica in (ReplicaState.PENDING.value, ReplicaState.COPYING.value):
        repair = "running"  # a repair is copying it back already
    elif verification == "running":
        repair = "pending"
    else:
        repair = "not needed"
    return {
        "replica_state": now.replica,
        "tier_copy_state": now.tier_copy,
        "repair": repair,
        "verification": verification,
    }


async def report_corrupt_copy(
    sessions: AsyncSessions,
    client: Client | None,
    settings: Settings,
    job: str,
    step: int,
    tier: str,
    path: str,
    reason: str,
    actor: str,
    *,
    branch: int | None = None,
    stripe: int | None = None,
) -> dict[str, Any]:
    if tier not in settings.tier_names():
        raise CopyNotFound(f"tier {tier!r} is not configured")
    coded = settings.tier(tier).stripe_code is not None
    if (stripe is not None) != coded:
        raise CopyNotFound(
            f"tier {tier!r} keeps stripes: name the stripe that did not match"
            if coded
            else f"tier {tier!r} keeps whole copies, not stripes"
        )
    if stripe is not None:
        report = _Report(job, step, tier, path, reason, actor, branch)
        return await _report_stripe(sessions, client, report, stripe)
    async with sessions() as session:
        ref = await session.run_sync(find_copy, job, step, tier, path, RECHECK_AFTER, branch)
        if ref.state != ReplicaState.VERIFIED.value:
            return _answer(await session.run_sync(copy_state, ref, tier), f"already {ref.state}")
        if ref.recently_read:
            return _answer(await session.run_sync(copy_state, ref, tier), "recently read back good")
        if client is None:
            raise TemporalUnavailable("cannot re-read the copy now: Temporal is unreachable")
        await session.run_sync(
            record,
            EventKind.CORRUPT_REPORTED,
            checkpoint_id=ref.checkpoint_id,
            job_id=ref.job_id,
            tier=tier,
            actor=actor,
            detail={"path": path, "reason": reason[:1000]},
        )
        # Committed before the re-read starts: the report stands whatever the re-read finds.
        await session.commit()
    node = ref.node if settings.tier(tier).on_nodes else None  # a peer copy: its holder
    wid = await start_verify(
        client, VerifyInput(tier=tier, node=node, replica_ids=[ref.replica_id], actor="report")
    )
    verification = await _await_verify(client, wid)
    async with sessions() as session:
        return _answer(await session.run_sync(copy_state, ref, tier), verification)


@dataclass(frozen=True)
class _Report:
    job: str
    step: int
    tier: str
    path: str
    reason: str
    actor: str
    branch: int | None


async def _report_stripe(
    sessions: AsyncSessions, client: Client | None, r: _Report, index: int
) -> dict[str, Any]:
    """A reader's stripe that did not match: read back on its holder (`VerifyReplicas` with the
    stripe, the scrub's own read of it), and only a confirmed mismatch moves it `found bad`
    (`tier_copy/stripe_damage.py`: not counted any more, the coded copy failed below k)."""
    async with sessions() as session:
        ref = await session.run_sync(
            find_stripe, r.job, r.step, r.tier, r.path, index, RECHECK_AFTER, r.branch
        )
        if ref.state != ReplicaState.VERIFIED.value:
            now = await session.run_sync(stripe_state, ref, r.tier)
            return _answer(now, f"already {ref.state}", stripe=True)
        if ref.recently_read:
            now = await session.run_sync(stripe_state, ref, r.tier)
            return _answer(now, "recently read back good", stripe=True)
        if client is None:
            raise TemporalUnavailable("cannot re-read the stripe now: Temporal is unreachable")
        await session.run_sync(
            record,
            EventKind.CORRUPT_REPORTED,
            checkpoint_id=ref.checkpoint_id,
            job_id=ref.job_id,
            tier=r.tier,
            actor=r.actor,
            detail={"path": r.path, "stripe": index, "reason": r.reason[:1000]},
        )
        await session.commit()
    # guard: reported-stripe-is-read-back-on-its-holder
    inp = VerifyInput(
        tier=r.tier, node=ref.holder, replica_ids=[], stripe_ids=[ref.stripe_id], actor="report"
    )
    verification = await _await_verify(client, await start_verify(client, inp))
    async with sessions() as session:
        now = await session.run_sync(stripe_state, ref, r.tier)
        return _answer(now, verification, stripe=True)


async def _await_verify(client: Client, wid: str) -> str:
    """The re-read's verdict, or "running" when it takes longer than REPORT_WAIT."""
    try:
        res: ScrubBatchResult = await asyncio.wait_for(
            client.get_workflow_handle(wid, result_type=ScrubBatchResult).result(), REPORT_WAIT
        )
    except TimeoutError:
        log.info("re-read of a reported copy still running", workflow_id=wid)
        return "running"
    return "confirmed" if (res.corrupt or res.lost) else "not confirmed"
