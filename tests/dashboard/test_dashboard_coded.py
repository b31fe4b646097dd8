"""A coded peer tier on the dashboard, in a real browser (Debian's chromium through Playwright)
against the real API and catalog: the job's matrix shows the coded copy's state with the margin
of its weakest set beside it (a stripe found bad: degraded, margin 0), the checkpoint's detail
says how its sets stand, and the tiers panel gives the tier's code and the bytes its stripes
hold, (k+m)/k of the files. The screenshot goes to docs/images, the copy the docs show."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from playwright.async_api import Browser
from sqlalchemy import Engine

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, chromium
from tests.dashboard.test_dashboard_operators import IMAGES, open_job
from tests.helpers.api import manifest, restorable, shard
from tests.helpers.cli import serving
from tests.helpers.coded_views import coded_copy, own_holders, with_coded_tier
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

__all__ = ["browser", "chromium"]

MiB = 1 << 20


@pytest.fixture
def holders(catalog: Engine) -> Iterator[list[str]]:
    with own_holders(catalog) as names:
        yield names


@pytest.fixture
async def url(settings: Settings, nodes: tuple[str, str], holders: list[str]) -> AsyncIterator[str]:
    async with serving(create_app(with_coded_tier(settings))) as served:
        yield served


async def test_the_job_page_shows_a_coded_copys_state_and_margin(
    url: str,
    browser: Browser,
    catalog: Engine,
    job: str,
    nodes: tuple[str, str],
    holders: list[str],
) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    admin = create_token(catalog, f"admin-{job}", ["admin"])
    body = manifest(1, [shard("a.bin", node=nodes[0], size=40 * MiB), shard("b.bin", size=MiB)])
    async with httpx.AsyncClient(base_url=url, headers=bearer(admin)) as api:
        r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
        assert r.status_code == 201, r.text
    restorable(catalog, job, 1, "ssd", local=True)
    coded_copy(catalog, job, 1, holders)

    page = await open_job(browser, url, admin, job)
    row = page.locator('#matrix tr[data-step="1"]')
    cell = row.locator("td.coded")
    await cell.wait_for(timeout=WAIT_MS)
    assert await cell.locator(".cell.restorable").inner_text() == "restorable"
    badge = cell.locator(".pill.margin")
    assert await badge.inner_text() == "margin 0"
    # Degraded, not below k: the badge is the colour of work to do, not of a failure.
    assert "busy" in (await badge.get_attribute("class") or "")
    title = await badge.get_attribute("title")
    assert title == "rs(2,1): 1 of 2 sets whole, 1 degraded (1 stripe short), margin 0", title

    usage = page.locator('.usage-row[data-tier="coded"]')
    text = await usage.inner_text()
    assert "peer rs(2,1)" in text and "held in stripes" in text, text
    await page.locator("#job-panel").screenshot(path=str(IMAGES / "dashboard-coded-tier.png"))
    await usage.screenshot(path=str(IMAGES / "dashboard-coded-usage.png"))

    await cell.locator(".cell").click()
    detail = page.locator("#detail-body")
    await detail.locator(".coverage").wait_for(timeout=WAIT_MS)
    assert await detail.locator(".coverage").inner_text() == title
