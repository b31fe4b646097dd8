"""The dashboard's operator pages in a real browser (Debian's chromium through Playwright) against
the real API: a job's page is a URL to share and opens in view; a step of 2^53 - 1 is shown
exactly and does not push the columns out; a long failure reason wraps in a wide column; an
acknowledged failure leaves the list and shows in the history, rendered as text; a deleted
checkpoint is marked in the job's matrix; the jobs view shows each job's steps at risk and a
restore time predicted from a tier's recorded reads (screenshots of these go to docs/images, the
copies the docs show); the nodes panel shows each node's failure domain."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, chromium
from tests.helpers.api import restorable, seed, set_marker
from tests.helpers.cli import serving
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.node.registry import upsert_nodes
from tierpoint.catalog.replica import scrub
from tierpoint.config import Settings

__all__ = ["browser", "chromium"]

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
TOP = 2**53 - 1
LONG_REASON = "1 of 1 shards have no verified replica on s3: " + ", ".join(
    f"layers/{i:03d}/attention.distcp (write to s3: SlowDown, retried)" for i in range(8)
)


@pytest.fixture
async def url(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[str]:
    async with serving(create_app(settings)) as served:
        yield served


async def open_job(browser: Browser, url: str, token: str, job: str) -> Page:
    page = await browser.new_page(viewport={"width": 1440, "height": 900})
    page.on("pageerror", lambda e: pytest.fail(f"page error: {e}"))
    await page.goto(f"{url}/#token={token}&job={job}")
    await page.locator("#matrix tbody tr[data-step]").first.wait_for(timeout=WAIT_MS)
    return page


async def in_view(page: Page, selector: str) -> bool:
    box = await page.locator(selector).bounding_box()
    return box is not None and 0 <= box["y"] < 900


async def test_a_job_page_with_a_huge_step_and_a_long_failure_then_acknowledged(
    url: str, browser: Browser, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    await seed(client, catalog, job, [TOP], tiers=("ssd", "lustre"))
    set_marker(catalog, job, TOP, "s3", "failed", reason=LONG_REASON)
    token = create_token(catalog, f"oncall-{job}", ["read", "operate"])

    page = await open_job(browser, url, token, job)
    # The shared URL names the job and opened its page, in view.
    assert page.url.endswith(f"#job={job}") and token not in page.url
    assert await in_view(page, "#job-panel")
    # The step exactly (2^53 - 1 is the last integer JavaScript holds), and no column pushed out.
    assert await page.locator(f'#matrix tr[data-step="{TOP}"]').count() == 1
    assert str(TOP) in await page.locator(f'tr[data-job="{job}"]').inner_text()
    overflow = await page.evaluate(
        "() => { const t = document.querySelector('#jobs');"
        " return t.scrollWidth - t.parentElement.clientWidth; }"
    )
    assert overflow <= 0, overflow
    await page.screenshot(path=str(IMAGES / "dashboard-large-step.png"))

    # The long reason wraps in a wide column: a few lines, not a sliver 200 px tall per row.
    row = page.locator(f'tr[data-failure="{job}/{TOP}/s3"]')
    await row.wait_for(timeout=WAIT_MS)
    reason = await row.locator("td.grow").bounding_box()
    assert reason is not None and reason["width"] >= 400, reason
    assert reason["height"] < 120, reason
    await row.scroll_into_view_if_needed()
    await row.screenshot(path=str(IMAGES / "dashboard-long-failure-reason.png"))

    # Acknowledged: it leaves the list, and the checkpoint's history says who did it.
    await row.get_by_role("button", name="acknowledge").click()
    await row.wait_for(state="detached", timeout=WAIT_MS)
    await page.locator(f'#matrix tr[data-step="{TOP}"] .cell').first.click()
    events = page.locator("#events")
    await events.wait_for(timeout=WAIT_MS)
    text = await events.inner_text()
    assert "acknowledged" in text and f"oncall-{job}" in text, text
    assert "reason: 1 of 1 shards" in text and '{"' not in text, text
    await page.screenshot(path=str(IMAGES / "dashboard-acknowledged.png"))


async def test_a_deleted_checkpoint_is_marked_on_the_job_page(
    url: str, browser: Browser, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    await seed(client, catalog, job, [1, 2], tiers=("ssd", "lustre", "s3"))
    admin = create_token(catalog, f"admin-{job}", ["admin"])
    async with httpx.AsyncClient(base_url=url, headers=bearer(admin)) as api:
        r = await api.delete(f"/v1/jobs/{job}/checkpoints/2")
        assert r.status_code == 202, r.text

    page = await open_job(browser, url, admin, job)
    row = page.locator('#matrix tr[data-step="2"]')
    await row.locator(".deleted").wait_for(timeout=WAIT_MS)
    assert await row.locator(".cell.expiring").count() == 3
    assert await page.locator('#matrix tr[data-step="1"] .deleted').count() == 0
    # The job's recovery point is step 1 again on every tier.
    assert (await page.locator(f'tr[data-job="{job}"]').inner_text()).count("step 1") >= 3
    await page.screenshot(path=str(IMAGES / "dashboard-deleted-checkpoint.png"))


async def test_the_jobs_view_shows_steps_at_risk_and_a_predicted_restore_time(
    url: str, browser: Browser, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    # Step 30 registered, 20 on ssd and lustre, 10 on every tier; a newer job nothing on s3.
    await seed(client, catalog, job, [10, 20, 30], tiers=())
    for step, tiers in ((10, ("ssd", "lustre", "s3")), (20, ("ssd", "lustre"))):
        for tier in tiers:
            restorable(catalog, job, step, tier, local=tier == "ssd")
    young = f"{job}-young"
    await seed(client, catalog, young, [5], tiers=("ssd",))
    # Reads recorded off lustre (0.4 B/s) and s3 (50 B/s); ssd was never read back.
    with sessionmaker(catalog).begin() as s:
        scrub.record_reads(s, "lustre", 2_000, 5_000.0)
        scrub.record_reads(s, "s3", 200, 4.0)
    token = create_token(catalog, f"oncall-{job}", ["read"])

    page = await browser.new_page(viewport={"width": 1440, "height": 900})
    page.on("pageerror", lambda e: pytest.fail(f"page error: {e}"))
    await page.goto(f"{url}/#token={token}")
    row = page.locator(f'tr[data-job="{job}"]')
    await row.wait_for(timeout=WAIT_MS)
    cells = row.locator("td")
    # job, latest, steps at risk, ssd, lustre, s3, ...
    assert await cells.nth(2).inner_text() == "20 / 10"
    assert await cells.nth(2).locator(".risk.some").count() == 2
    # Ages in words: "4m behind" read as a distance from the latest step, not an age.
    ssd = await cells.nth(3).inner_text()
    assert re.search(r"10 steps behind · \d+ seconds? old", ssd) and "restore" not in ssd, ssd
    assert "restore ~8m" in await cells.nth(4).inner_text()  # 200 B at 0.4 B/s
    assert "restore ~4s" in await cells.nth(5).inner_text()  # 200 B at 50 B/s
    risk = page.locator(f'tr[data-job="{young}"] td').nth(2)
    assert await risk.inner_text() == "all / 0"
    assert await risk.locator(".risk.all").count() == 1
    await page.locator("#jobs-panel").screenshot(path=str(IMAGES / "dashboard-steps-at-risk.png"))


async def test_the_nodes_panel_shows_each_node_failure_domain(
    url: str, browser: Browser, catalog: Engine
) -> None:
    tag = uuid.uuid4().hex[:8]
    racked, bare = f"node-{tag}-r", f"node-{tag}-b"
    with Session(catalog) as s:
        upsert_nodes(s, {racked: {}, bare: {}}, domains={racked: f"rack-{tag}"})
        s.commit()
    token = create_token(catalog, f"oncall-{tag}", ["read"])

    page = await browser.new_page(viewport={"width": 1440, "height": 900})
    page.on("pageerror", lambda e: pytest.fail(f"page error: {e}"))
    await page.goto(f"{url}/#token={token}")
    row = page.locator(f'#nodes tr[data-node="{racked}"]')
    await row.wait_for(timeout=WAIT_MS)
    # node, domain, last seen, local bytes, state
    assert await page.locator("#nodes th").nth(1).inner_text() == "DOMAIN"
    assert await row.locator("td").nth(1).inner_text() == f"rack-{tag}"
    unlabelled = page.locator(f'#nodes tr[data-node="{bare}"] td').nth(1)
    assert await unlabelled.inner_text() == "none"
    assert "its own" in (await unlabelled.get_attribute("title") or "")
    assert await row.locator("td").nth(4).inner_text() == "ok"
