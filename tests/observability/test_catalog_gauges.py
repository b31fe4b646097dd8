"""The API's catalog gauges follow the catalog: a registered checkpoint is in flight on every
tier, a restorable marker gives its job a recovery point on that tier, and a deleted job's series
disappear. The refresher runs in the app's lifespan as in production, only more often."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from sqlalchemy import Engine, text

from api.app import create_app
from tests.helpers.api import manifest, running_client, scrape_api, set_marker, shard
from tests.helpers.scrape import Samples, parse, value
from tierpoint.config import Settings

STEP = 10
HANG = 120  # a hang guard only


async def _until(api: httpx.AsyncClient, done: Callable[[Samples], bool]) -> Samples:
    async with asyncio.timeout(HANG):
        while True:
            samples = parse(await scrape_api(api))
            if done(samples):
                return samples
            await asyncio.sleep(0.1)


async def test_the_gauges_follow_the_catalog(
    settings: Settings, job: str, catalog: Engine, nodes: tuple[str, str]
) -> None:
    cfg = settings.model_copy(update={"metrics_refresh_seconds": 0.1})
    tiers = cfg.tier_names()
    age = "tierpoint_recovery_point_age_seconds"
    behind = "tierpoint_recovery_point_steps_behind"
    async for api in running_client(create_app(cfg)):
        # No worker serves this module's queues now: the markers stay pending.
        body = manifest(STEP, [shard("a.bin", nodes[0])])
        assert (await api.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201
        samples = await _until(
            api,
            lambda s: all(
                (value(s, "tierpoint_checkpoints_in_flight", tier=t) or 0) >= 1 for t in tiers
            ),
        )
        assert all(value(samples, age, job=job, tier=t) is None for t in tiers)

        set_marker(catalog, job, STEP, "lustre", "restorable")
        body = manifest(STEP + 5, [shard("a.bin", nodes[0])])
        assert (await api.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201
        # The gauges refresh on their own clock, not on a scrape: a round may have run between
        # the marker's change and the second registration, so wait for the round after both.
        samples = await _until(api, lambda s: value(s, behind, job=job, tier="lustre") == 5)
        assert (value(samples, age, job=job, tier="lustre") or -1) >= 0
        assert value(samples, age, job=job, tier="s3") is None

        with catalog.begin() as conn:
            conn.execute(text("DELETE FROM job WHERE name = :n"), {"n": job})
        samples = await _until(api, lambda s: value(s, age, job=job, tier="lustre") is None)
        assert value(samples, behind, job=job, tier="lustre") is None
        refreshes = "tierpoint_api_catalog_metrics_refreshes_total"
        assert (value(samples, refreshes, outcome="ok") or 0) >= 3
