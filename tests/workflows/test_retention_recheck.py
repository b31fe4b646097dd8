"""The re-check under row locks, end to end: a pin or a lease taken after the retention run planned
an expiry, and before the expiry began, cancels it, and the bytes stay.

The interleaving is made by the catalog's own locking, not by timing: the pin (or lease) is taken
by the API's catalog function in a transaction that holds the checkpoint row and is committed only
once the real JobRetention workflow's begin activity waits for that row. The plan before it did
not see the pin; the re-check after it must."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus

from tests.helpers.expiry_races import lock_waiters
from tests.helpers.lifecycle import running_workers
from tests.helpers.retention import (
    NODES,
    create_job,
    markers,
    replica_states,
    set_policy,
    settle,
    write_checkpoint,
)
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.holds import leases, pins
from tierpoint.config import Settings
from tierpoint.contract.retention import retention_workflow_id
from tierpoint.temporal import request_retention
from workflows.retention import JobRetention

KEEP_ALL: dict[str, object] = {"tiers": {}}
SSD_LAST_1 = {"tiers": {"ssd": {"keep_last": 1}}}
# Only a bound on a hang, never a timing assertion.
WAIT_LIMIT = 240.0


@asynccontextmanager
async def _transaction(settings: Settings) -> AsyncIterator[AsyncSession]:
    """An open catalog transaction, committed when the block ends without error."""
    engine = make_async_engine(settings.database_url, pool_size=1)
    try:
        async with async_sessions(engine)() as session, session.begin():
            yield session
    finally:
        await engine.dispose()


async def _take(s: AsyncSession, kind: str, job: str, step: int) -> int | None:
    if kind == "pin":
        view = await s.run_sync(pins.set_pinned, job, step, True, actor="test")
        assert view.changed
        return None
    lease = await s.run_sync(leases.create_lease, job, step, 3600, "test", actor="test")
    return lease.id


async def _until_begin_waits(client: Client, catalog: Engine, job: str) -> None:
    """Until a catalog session waits for a row lock (the begin activity, for the checkpoint row
    the pin holds); fails if the retention run ends first, i.e. it never waited."""
    handle = client.get_workflow_handle(retention_workflow_id(job))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT
    while loop.time() < deadline:
        if await asyncio.to_thread(lock_waiters, catalog):
            return
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            raise AssertionError(
                f"the retention run ended ({desc.status}) without waiting for the pin's row lock"
            )
        await asyncio.sleep(0.05)
    raise AssertionError("the retention run neither waited for the row lock nor ended")


def _files(settings: Settings, job: str, step: int) -> dict[str, bytes]:
    out = {}
    for node in NODES:
        base = settings.tier("ssd").root_for(node) / job / str(step)
        for p in base.rglob("*") if base.exists() else ():
            if p.is_file():
                out[p.relative_to(base).as_posix()] = p.read_bytes()
    return out


@pytest.mark.parametrize("kind", ["pin", "lease"])
async def test_a_pin_or_lease_taken_after_planning_cancels_the_expiry(
    kind: str,
    settings: Settings,
    sessions: sessionmaker[Session],
    engine: Engine,
    client: Client,
) -> None:
    job = f"recheck-{uuid.uuid4().hex[:10]}"
    policy_id = create_job(sessions, job, KEEP_ALL)
    async with running_workers(settings, client):
        first, _ = await write_checkpoint(settings, sessions, client, job, 1)
        await write_checkpoint(settings, sessions, client, job, 2)
        assert (await settle(client, job)).expired == 0
        written = {sh.path: sh.data for sh in first.shards}
        assert _files(settings, job, 1) == written

        # The pin (lease) transaction holds step 1's row; the policy now wants step 1 off ssd.
        async with _transaction(settings) as pin:
            lease = await _take(pin, kind, job, 1)
            set_policy(sessions, policy_id, SSD_LAST_1)
            await request_retention(client, job, "test: policy changed")
            # The plan did not see the uncommitted pin and planned step 1's expiry; its begin
            # activity now waits for the row. The pin commits when this block ends.
            await _until_begin_waits(client, engine, job)
        held = await settle(client, job, request=False)

        assert (held.expired, held.skipped, held.failed) == (0, 1, 0), held
        status = await client.get_workflow_handle(retention_workflow_id(job)).query(
            JobRetention.status
        )
        skip = status.last_skip or ""
        assert "step 1 on ssd" in skip and "kept now" in skip, skip
        assert ("pinned" if kind == "pin" else "leased") in skip, skip
        # The bytes stay, and so does the copy's standing: restorable, every replica verified.
        assert _files(settings, job, 1) == written
        assert markers(sessions, job)[(1, "ssd")] == "restorable"
        assert replica_states(sessions, job)[(1, "ssd")] == {"verified"}

        # Let it go: the policy did want step 1 gone from ssd, and now it goes.
        async with _transaction(settings) as s:
            if kind == "pin":
                await s.run_sync(pins.set_pinned, job, 1, False, actor="test")
            else:
                assert lease is not None
                await s.run_sync(leases.release_lease, job, 1, lease, actor="test")
        done = await settle(client, job)
    assert (done.expired, done.failed) == (1, 0), done
    assert markers(sessions, job)[(1, "ssd")] == "expired"
    assert _files(settings, job, 1) == {}
    assert markers(sessions, job)[(2, "ssd")] == "restorable"
