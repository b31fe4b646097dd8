"""A new user's first day with the dashboard, in a real browser (Debian's chromium through
Playwright) against the real API:

- a checkpoint copied by real workers through ssd -> lustre -> s3 shows, in the jobs view, how
  long a restore from each tier is predicted to take (its bytes at the speed the copies' own
  read-backs measured), as the view's caption promises; and a job's page, opened, shows its
  heading below the sticky header, not under it;
- after a restart, the failures panel says "50 of 52"; a lost node's failure says its reason
  once and offers no retry (saying why), as do copies lost with no other copy left, while a
  failure a retry can fix keeps its button; one filter and one click acknowledge every failure
  whose reason matches.

Screenshots go to TIERPOINT_SCREENSHOTS (default build/screenshots/); the failures panel's to
docs/images, the copy the docs show."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from temporalio.client import Client

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, chromium, shots
from tests.helpers.api import (
    NODE_A,
    events,
    manifest,
    restorable,
    seed,
    set_marker,
    set_replicas,
    shard,
)
from tests.helpers.cli import serving
from tests.helpers.lifecycle import crc_hex, running_workers, shard_file
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.node.registry import upsert_nodes
from tierpoint.config import Settings

__all__ = ["browser", "chromium", "shots"]

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
DATA = b"first-day weights " * 60_000
LOST_ON_S3 = "2 shard(s) lost on s3 (found by reconcile): s{step}/0 (reconcile: missing on s3)"


@pytest.fixture
async def stack_url(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[str]:
    async with running_workers(settings, temporal), serving(create_app(settings)) as url:
        yield url


async def open_dashboard(browser: Browser, url: str, token: str, height: int = 900) -> Page:
    page = await browser.new_page(viewport={"width": 1440, "height": height})
    page.on("pageerror", lambda e: pytest.fail(f"page error: {e}"))
    await page.goto(f"{url}/#token={token}")
    return page


async def test_each_tier_predicts_its_restore_and_a_job_page_opens_below_the_header(
    stack_url: str, browser: Browser, settings: Settings, catalog: Engine, job: str, shots: Path
) -> None:
    token = create_token(catalog, f"oncall-{job}", ["read", "operate"])
    trainer = create_token(catalog, f"trainer-{job}", [f"train:{job}"])
    f = shard_file(settings, "ssd", NODE_A, job, 10, "model.bin")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(DATA)
    body = manifest(10, [shard("model.bin", size=len(DATA), crc=crc_hex(DATA))])
    async with httpx.AsyncClient(base_url=stack_url, headers=bearer(trainer)) as api:
        r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
        assert r.status_code == 201, r.text

    # A short window, so that the page scrolls to the job's panel.
    page = await open_dashboard(browser, stack_url, token, height=600)
    row = page.locator(f'tr[data-job="{job}"]')
    # The caption promises a predicted restore time: every tier's cell shows one, once the
    # copies (which read every shard back from the tier) are done.
    await page.wait_for_function(
        """job => { const r = document.querySelector(`tr[data-job="${job}"]`);
            return r && r.querySelectorAll('.restore').length === 3; }""",
        arg=job,
        timeout=WAIT_MS,
    )
    cells = row.locator("td")
    for i in (3, 4, 5):  # job, latest, steps at risk, ssd, lustre, s3, ...
        text = await cells.nth(i).inner_text()
        assert "step 10" in text and re.search(r"restore (<1s|~\d)", text), text
    caption = await page.locator("#jobs-panel .hint").inner_text()
    assert "restore from the tier is predicted to take" in caption, caption
    jobs_panel = page.locator("#jobs-panel")
    await jobs_panel.screenshot(path=str(shots / "dashboard-predicted-restore.png"))

    await row.click()
    heading = page.locator("#job-panel h2")
    await page.locator("#matrix tbody tr[data-step]").first.wait_for(timeout=WAIT_MS)
    await page.wait_for_function("() => window.scrollY > 0", timeout=WAIT_MS)
    header = await page.locator("header").bounding_box()
    box = await heading.bounding_box()
    assert header is not None and box is not None
    # The heading is in view and below the header, not under it.
    assert header["y"] + header["height"] <= box["y"] < 600, (header, box)
    await page.screenshot(path=str(shots / "dashboard-job-page-below-header.png"))


async def lost_node_failure(client: httpx.AsyncClient, catalog: Engine, job: str) -> str:
    """A checkpoint on its own node, restorable everywhere, then the node declared lost."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    with Session(catalog) as s:
        upsert_nodes(s, {node: {}})
        s.commit()
    shards = [shard("rank0.bin", node=node, size=100), shard("rank1.bin", node=node, size=100)]
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(500, shards))
    assert r.status_code == 201, r.text
    for tier in ("ssd", "lustre", "s3"):
        restorable(catalog, job, 500, tier, local=tier == "ssd")
    r = await client.post(f"/v1/nodes/{node}/lost")
    assert r.status_code == 200, r.text
    return node


async def test_failures_say_when_no_retry_can_help_and_are_acknowledged_by_reason(
    url: str, browser: Browser, client: httpx.AsyncClient, catalog: Engine, job: str, shots: Path
) -> None:
    restarted = f"{job}-demo"
    await seed(client, catalog, restarted, list(range(1, 51)), tiers=())
    for step in range(1, 51):
        for tier in ("ssd", "lustre"):
            set_replicas(catalog, restarted, step, tier, "expired", local=tier == "ssd")
            set_marker(catalog, restarted, step, tier, "expired")
        set_marker(catalog, restarted, step, "s3", "failed", reason=LOST_ON_S3.format(step=step))
    await seed(client, catalog, job, [400], tiers=("ssd", "lustre"))
    set_marker(catalog, job, 400, "s3", "failed", reason="1 of 2 shards not copied: SlowDown")
    node = await lost_node_failure(client, catalog, job)
    token = create_token(catalog, f"oncall-{job}", ["read", "operate"])

    page = await open_dashboard(browser, url, token)
    lost = page.locator(f'tr[data-failure="{job}/500/ssd"]')
    await lost.wait_for(timeout=WAIT_MS)
    assert await page.locator("#failures-count").inner_text() == "50 of 52"
    assert "52" in await page.locator("#summary").inner_text()
    # The lost node's failure: its reason once, and no retry, saying why.
    text = await lost.inner_text()
    assert text.count("its local copies are gone") == 1, text
    assert await lost.get_by_role("button", name="retry").count() == 0
    no_retry = lost.locator(".no-retry")
    assert await no_retry.inner_text() == "no retry: its node was declared lost"
    assert node in (await no_retry.get_attribute("title") or "")
    # A failure a retry can fix keeps its button; a copy with no other copy left has none.
    fixable = page.locator(f'tr[data-failure="{job}/400/s3"]')
    assert await fixable.get_by_role("button", name="retry").count() == 1
    gone = page.locator(f'tr[data-failure="{restarted}/50/s3"]')
    assert await gone.locator(".no-retry").inner_text() == "no retry: no copy left to copy from"
    await page.locator("#failures-panel").screenshot(path=str(shots / "dashboard-failures-52.png"))

    # Filter by reason, then acknowledge every match at once.
    await page.locator("#failures-reason").fill("lost on s3")
    await page.locator("#failures-reason").press("Enter")
    bulk = page.locator("#failures-ack")
    await page.wait_for_function(
        "() => document.querySelector('#failures-ack').textContent === 'acknowledge 50 matching'",
        timeout=WAIT_MS,
    )
    assert await page.locator("#failures-count").inner_text() == "50"
    await bulk.click()
    await page.locator("#failures td.empty").wait_for(timeout=WAIT_MS)
    assert await page.locator("#failures td.empty").inner_text() == "no failure matches"
    await page.locator("#failures-reason").fill("")
    await page.locator("#failures-reason").press("Enter")
    await page.wait_for_function(
        "() => document.querySelector('#failures-count').textContent === '2'", timeout=WAIT_MS
    )
    assert await lost.count() == 1 and await fixable.count() == 1
    acked = events(catalog, "acknowledged", job=restarted)
    assert len(acked) == 50 and {e["actor"] for e in acked} == {f"oncall-{job}"}, acked[:2]
    assert acked[0]["detail"]["acknowledged_by"] == {"reason": "lost on s3"}, acked[0]
    # The copy the docs show (docs/operations.md).
    IMAGES.mkdir(parents=True, exist_ok=True)
    await page.locator("#failures-panel").screenshot(path=str(IMAGES / "dashboard-failures.png"))


@pytest.fixture
async def url(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[str]:
    async with serving(create_app(settings)) as served:
        yield served
