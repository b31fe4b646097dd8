"""A restarting job's question: the latest checkpoint it can restore, with a restore lease taken
atomically with the answer when asked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tierpoint.catalog.engine import AsyncSession
from tierpoint.catalog.holds.leases import insert_lease
from tierpoint.catalog.job.lookup import job_id_by_name
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.reads.views import LatestRestorableView
from tierpoint.errors import TierNeedsRestoreRequest
from tierpoint.tier_config import TierConfig


@dataclass(frozen=True)
class LeaseRequest:
    ttl_seconds: int
    owner: str | None
    actor: str


async def latest_with_lease(
    session: AsyncSession,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    node: str | None = None,
    lease: LeaseRequest | None = None,
    branch: int | None = None,
    good: bool = False,
) -> LatestRestorableView:
    """The latest restorable checkpoint for the caller; with `lease`, the chosen checkpoint's row
    stays locked from before its plan is read until the lease is inserted, so retention cannot
    expire what the answer points at. The caller commits.

    Tiers whose objects need an S3 restore request (GLACIER, DEEP_ARCHIVE) are never a source:
    a restore plan pointing at them would fail on the first read."""
    readable = [t for t in tiers if not t.needs_restore_request]
    if tier is not None and tier not in {t.name for t in readable}:
        named = next((t for t in tiers if t.name == tier), None)
        if named is not None:
            raise TierNeedsRestoreRequest(
                f"tier {tier!r} stores objects in {named.storage_class}, which S3 must restore "
                "(RestoreObject, minutes to hours) before they can be read; tierpoint does not "
                "issue restore requests: restore from another tier, or restore the objects with "
                "the AWS tools first"
            )
    found = await session.run_sync(
        latest_restorable,
        job,
        readable,
        tier=tier,
        node=node,
        lock=lease is not None,
        branch=branch,
        good=good,
    )
    if lease is None:
        return found
    # The checkpoint's own job: a fork's first restore leases its parent's checkpoint.
    job_id = await session.run_sync(job_id_by_name, found.job)
    assert job_id is not None  # the job has a restorable checkpoint, whose row is locked
    taken = await session.run_sync(
        insert_lease,
        found.checkpoint.id,
        job_id,
        found.job,
        found.step,
        lease.ttl_seconds,
        lease.owner,
        lease.actor,
    )
    return dataclasses.replace(found, lease=taken)
