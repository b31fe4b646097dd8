"""The scrub and reconciliation schedules follow the settings: created (and kept up to date) when
an interval is given, deleted when turned off, and a triggered scrub runs to its end."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError

from tests.helpers.faults import OVERALL_TIMEOUT
from tests.helpers.lifecycle import running_workers
from tierpoint.config import Settings
from tierpoint.contract.integrity import (
    RECONCILE_SCHEDULE_ID,
    RECONCILE_WORKFLOW,
    SCRUB_SCHEDULE_ID,
    SCRUB_WORKFLOW,
)
from tierpoint.temporal import ensure_integrity_schedules


async def _exists(client: Client, schedule_id: str) -> bool:
    try:
        await client.get_schedule_handle(schedule_id).describe()
    except RPCError:
        return False
    return True


async def test_schedules_follow_the_settings_and_a_triggered_scrub_completes(
    settings: Settings, client: Client
) -> None:
    cfg = settings.model_copy(update={"scrub_interval": timedelta(minutes=7)})
    async with running_workers(cfg, client, nodes=()):
        # The shared worker makes it as it starts, after this block has begun.
        deadline = asyncio.get_running_loop().time() + OVERALL_TIMEOUT
        while not await _exists(client, SCRUB_SCHEDULE_ID):
            assert asyncio.get_running_loop().time() < deadline, "no scrub schedule"
            await asyncio.sleep(0.2)
        desc = await client.get_schedule_handle(SCRUB_SCHEDULE_ID).describe()
        assert getattr(desc.schedule.action, "workflow", None) == SCRUB_WORKFLOW
        assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=7)]
        assert not await _exists(client, RECONCILE_SCHEDULE_ID)

        await client.get_schedule_handle(SCRUB_SCHEDULE_ID).trigger()

        async def scrub_completed() -> bool:
            query = f"WorkflowType = '{SCRUB_WORKFLOW}' AND ExecutionStatus = 'Completed'"
            return bool([wf async for wf in client.list_workflows(query)])

        deadline = asyncio.get_running_loop().time() + OVERALL_TIMEOUT
        while not await scrub_completed():
            assert asyncio.get_running_loop().time() < deadline, "the triggered scrub never ended"
            await asyncio.sleep(0.3)

        # Scrub off, reconciliation on; then both as before. Idempotent both ways.
        for _ in range(2):
            await ensure_integrity_schedules(client, None, timedelta(hours=6))
        assert not await _exists(client, SCRUB_SCHEDULE_ID)
        desc = await client.get_schedule_handle(RECONCILE_SCHEDULE_ID).describe()
        assert getattr(desc.schedule.action, "workflow", None) == RECONCILE_WORKFLOW
        assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(hours=6)]
        await ensure_integrity_schedules(client, timedelta(minutes=7), None)
        assert await _exists(client, SCRUB_SCHEDULE_ID)
        assert not await _exists(client, RECONCILE_SCHEDULE_ID)
