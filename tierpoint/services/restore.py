"""A restarting job's question: the latest checkpoint it can restore, with a restore lease taken
atomically with the answer when asked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from tierpoint.catalog.checkpoint_reads import job_id_of
from tierpoint.catalog.latest_restorable import latest_restorable
from tierpoint.catalog.leases_repo import insert_lease
from tierpoint.catalog.views import LatestRestorableView
from tierpoint.config import TierConfig


@dataclass(frozen=True)
class LeaseRequest:
    ttl_seconds: int
    holder: str | None
    actor: str


async def latest_with_lease(
    session: AsyncSession,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    node: str | None = None,
    lease: LeaseRequest | None = None,
) -> LatestRestorableView:
    """The latest restorable checkpoint for the caller; with `lease`, the chosen checkpoint's row
    stays locked from before its plan is read until the lease is inserted, so retention cannot
    expire what the answer points at. The caller commits."""
    found = await latest_restorable(
        session, job, tiers, tier=tier, node=node, lock=lease is not None
    )
    if lease is None:
        return found
    job_id = await job_id_of(session, job)
    assert job_id is not None  # the job has a restorable checkpoint, whose row is locked
    taken = await insert_lease(
        session,
        found.checkpoint.id,
        job_id,
        job,
        found.step,
        lease.ttl_seconds,
        lease.holder,
        lease.actor,
    )
    return dataclasses.replace(found, lease=taken)
