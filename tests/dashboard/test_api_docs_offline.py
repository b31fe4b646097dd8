"""The API reference pages on an air-gapped cluster, in a real browser (Debian's chromium through
Playwright): `/docs` (Swagger UI, the dev stack banner's "OpenAPI" line) and `/redoc` render
every operation of the API with no request leaving 127.0.0.1. The browser refuses every request
to another host, as a cluster without internet would. Screenshots go to TIERPOINT_SCREENSHOTS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import Browser, Page, Route

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, chromium, shots
from tests.helpers.cli import serving
from tierpoint.config import Settings

__all__ = ["browser", "chromium", "shots"]

LOCAL = "127.0.0.1"


@pytest.fixture
async def url(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[str]:
    async with serving(create_app(settings)) as served:
        yield served


async def offline_page(browser: Browser) -> tuple[Page, list[str], list[str]]:
    """A page whose requests to any host but 127.0.0.1 are refused; (page, refused URLs, URLs
    that failed to load)."""
    page = await browser.new_page(viewport={"width": 1440, "height": 900})
    refused: list[str] = []
    failed: list[str] = []

    async def gate(route: Route) -> None:
        host = urlsplit(route.request.url).hostname
        if route.request.url.startswith("data:") or host == LOCAL:
            await route.continue_()
        else:
            refused.append(route.request.url)
            await route.abort("internetdisconnected")

    await page.route("**/*", gate)
    page.on("requestfailed", lambda r: failed.append(r.url))
    return page, refused, failed


async def operations(url: str) -> list[str]:
    """The summaries of the API's operations, from the OpenAPI document the pages render."""
    async with httpx.AsyncClient(base_url=url) as api:
        doc = (await api.get("/openapi.json")).json()
    return [op["summary"] for item in doc["paths"].values() for op in item.values()]


async def test_the_api_docs_render_every_operation_without_internet(
    url: str, browser: Browser, shots: Path
) -> None:
    summaries = await operations(url)
    assert len(summaries) > 40, len(summaries)

    page, refused, failed = await offline_page(browser)
    await page.goto(f"{url}/docs", wait_until="load")
    assert refused == [], refused
    # Every operation has its row, and the first one opens with its parameters and responses.
    blocks = page.locator(".opblock")
    await blocks.nth(len(summaries) - 1).wait_for(timeout=WAIT_MS)
    assert await blocks.count() == len(summaries)
    assert await page.locator(".opblock-summary-description").first.inner_text() in summaries
    await blocks.first.locator(".opblock-summary").click()
    await page.locator(".opblock-body .responses-table").first.wait_for(timeout=WAIT_MS)
    await page.screenshot(path=f"{shots}/api-docs-offline.png")
    assert refused == [] and failed == [], (refused, failed)

    page, refused, failed = await offline_page(browser)
    await page.goto(f"{url}/redoc", wait_until="load")
    assert refused == [], refused
    # ReDoc lists each operation in its side menu by summary.
    menu = page.locator("[role=menuitem]")
    await menu.filter(has_text=summaries[-1]).first.wait_for(timeout=WAIT_MS)
    assert await page.get_by_text(summaries[0]).count() >= 1
    await page.screenshot(path=f"{shots}/api-redoc-offline.png")
    assert refused == [] and failed == [], (refused, failed)
