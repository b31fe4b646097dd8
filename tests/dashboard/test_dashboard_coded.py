"""A coded peer tier on the dashboard, in a real browser (Debian's chromium through Playwright)
against the real API and catalog: the job's matrix shows the coded copy's state with the margin
of its weakest set beside it (a stripe found bad: degraded, margin 0), the checkpoint's detail
says how its sets stand, and the tiers panel gives the tier's code and the bytes its stripes
hold, (k+m)/k of the files; the detail lists each shard's stripes by index with its holder, a
stripe found bad or on a lost holder marked. The screenshots go to docs/images, the copies the
docs show."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from playwright.async_api import Browser
from sqlalchemy import Engine, func, update
from sqlalchemy.orm import Session

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, chromium
from tests.dashboard.test_dashboard_operators import IMAGES, open_job
from tests.helpers.api import manifest, restorable, shard
from tests.helpers.cli import serving
from tests.helpers.coded_views import coded_copy, own_holders, with_coded_tier
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Node
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


async def test_the_checkpoint_detail_shows_each_stripe_with_its_holder_and_state(
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
    # The parity stripes' holder declared lost: its stripes stay verified but no longer count.
    with Session(catalog) as s, s.begin():
        s.execute(update(Node).where(Node.id == holders[2]).values(lost_at=func.now()))

    page = await open_job(browser, url, admin, job)
    cell = page.locator('#matrix tr[data-step="1"] td.coded .cell')
    await cell.wait_for(timeout=WAIT_MS)
    await cell.click()
    table = page.locator('#detail-body table.stripes[data-tier="coded"]')
    await table.wait_for(timeout=WAIT_MS)
    heads = [h.strip() for h in await table.locator("thead th").all_text_contents()]
    assert heads == ["shard", "data 0", "data 1", "parity 0"], heads

    async def stripes(path: str) -> list[tuple[str, str]]:
        cells = table.locator(f'tr[data-path="{path}"] .stripe')
        texts = await cells.all_inner_texts()
        kinds = [(await cells.nth(i).get_attribute("class") or "") for i in range(len(texts))]
        return [(t, k.replace("stripe ", "")) for t, k in zip(texts, kinds, strict=True)]

    # Stripe 0 of a.bin found bad by the scrub, the parity holder lost: both marked, each why.
    assert await stripes("a.bin") == [
        (f"{holders[0]} · corrupt", "bad"),
        (holders[1], "ok"),
        (f"{holders[2]} · holder lost", "bad"),
    ]
    assert await stripes("b.bin") == [
        (holders[0], "ok"),
        (holders[1], "ok"),
        (f"{holders[2]} · holder lost", "bad"),
    ]
    await page.locator("#detail").screenshot(path=str(IMAGES / "dashboard-coded-stripes.png"))
