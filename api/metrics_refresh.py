"""The catalog gauges of /metrics: recovery point age and steps behind per job and tier,
checkpoints in flight per tier, free space of the shared tiers. Recomputed every
`metrics_refresh_seconds` by a background task of the API's lifespan, not on scrape: a scrape
stays cheap however often it comes, and the cost per round is bounded (jobs are read in pages,
at most MAX_JOBS of them; the pending tier copies through their partial index)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tierpoint import logs
from tierpoint.catalog.engine import AsyncSessions
from tierpoint.catalog.reads import metrics, overview
from tierpoint.config import Settings
from tierpoint.metrics_api import ApiMetrics
from tierpoint.storage.posix.space import disk_space
from tierpoint.tier_config import TierKind

log = logs.get(__name__)

PAGE = 500
# Label sets are jobs x tiers: past this many jobs the gauges would cost Prometheus more than
# they tell; the operator views still list every job.
MAX_JOBS = 10_000

Point = tuple[str, str]  # (job, tier)


class CatalogGauges:
    def __init__(self, settings: Settings, metrics: ApiMetrics, sessions: AsyncSessions) -> None:
        self._settings = settings
        self._metrics = metrics
        self._sessions = sessions
        self._exported: set[Point] = set()

    async def refresh(self) -> None:
        tiers = self._settings.tier_names()
        points: dict[Point, tuple[float, int]] = {}
        async with self._sessions() as s:
            pending = await s.run_sync(metrics.pending_tier_copies_by_tier)
            after: str | None = None
            jobs = 0
            while jobs < MAX_JOBS:
                page, after, _ = await s.run_sync(
                    overview.jobs_overview,
                    tiers,
                    limit=min(PAGE, MAX_JOBS - jobs),
                    after_name=after,
                )
                jobs += len(page)
                for view in page:
                    for t in view.tiers:
                        if t.age_seconds is not None:
                            points[(view.job, t.tier)] = (t.age_seconds, t.steps_behind or 0)
                if after is None:
                    break
            else:
                log.warning("catalog gauges cover the first jobs only", max_jobs=MAX_JOBS)
        m = self._metrics
        for tier in tiers:
            m.in_flight.labels(tier).set(pending.get(tier, 0))
        for (job, tier), (age, behind) in points.items():
            m.recovery_point_age.labels(job, tier).set(max(age, 0.0))
            m.recovery_point_steps_behind.labels(job, tier).set(behind)
        # Jobs deleted, or tiers whose last restorable copy expired, since the last round.
        for job, tier in self._exported - points.keys():
            with contextlib.suppress(KeyError):
                m.recovery_point_age.remove(job, tier)
                m.recovery_point_steps_behind.remove(job, tier)
        self._exported = set(points)
        await self._space()
        m.catalog_refreshed.set(time.time())

    async def _space(self) -> None:
        for t in self._settings.tiers:
            if t.kind is not TierKind.SHARED:
                continue
            # statvfs of a network file system can block: never on the event loop.
            space = await asyncio.to_thread(disk_space, t.root_for(None))
            if space is None:
                with contextlib.suppress(KeyError):
                    self._metrics.tier_free_bytes.remove(t.name)
                    self._metrics.tier_capacity_bytes.remove(t.name)
                continue
            free, capacity = space
            self._metrics.tier_free_bytes.labels(t.name).set(free)
            self._metrics.tier_capacity_bytes.labels(t.name).set(capacity)

    async def run(self) -> None:
        """Refresh now and then every `metrics_refresh_seconds` until cancelled; a failed round
        (the catalog away) is logged and counted, and the gauges keep their last values."""
        while True:
            try:
                await self.refresh()
                self._metrics.catalog_refreshes.labels("ok").inc()
            except Exception as exc:
                self._metrics.catalog_refreshes.labels("error").inc()
                log.warning(
                    "catalog gauges not refreshed", error=f"{type(exc).__name__}: {exc}"[:500]
                )
            await asyncio.sleep(self._settings.metrics_refresh_seconds)
