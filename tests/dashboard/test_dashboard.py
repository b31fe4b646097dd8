"""The dashboard in a real browser (Debian's chromium, driven by Playwright through its
executable path) against a real stack: the API served by uvicorn, real workers copying real files
through every tier. The page shows the stack's jobs, a throttled copy's progress bar moves, and
the retry button of a checkpoint that failed for a missing file makes it restorable once the file
is there. Screenshots go to TIERPOINT_SCREENSHOTS (default build/screenshots/)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright
from sqlalchemy import Engine
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, manifest, shard
from tests.helpers.cli import serving
from tests.helpers.lifecycle import running_workers, shard_file
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

MiB = 1024 * 1024
# Five 8 MiB chunks at 4 MiB/s off the node's ssd: ~10 s of visible progress per tier copy.
SIZE = 40 * MiB
READ_LIMIT = 4 * MiB
# Guards against a hang, not a performance assertion (milliseconds, as Playwright counts).
WAIT_MS = 120_000
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("TIERPOINT_SCREENSHOTS", ROOT / "build" / "screenshots"))
# As the probe of this machine found: without the background-networking flags chromium keeps
# dialling Google's hosts, which a closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    path = os.environ.get("TIERPOINT_CHROMIUM") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.fail(
            f"no chromium at {path}: `python3 bootstrap.py test` installs Debian's chromium "
            "(or set TIERPOINT_CHROMIUM to a Chromium binary)"
        )
    return path


@pytest.fixture
def throttled(settings: Settings) -> Settings:
    tiers = [
        t.model_copy(update={"read_bandwidth_limit": READ_LIMIT}) if t.name == "ssd" else t
        for t in settings.tiers
    ]
    return settings.model_copy(update={"tiers": tiers})


@pytest.fixture
async def stack_url(
    throttled: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[str]:
    async with running_workers(throttled, temporal), serving(create_app(throttled)) as url:
        yield url


@pytest.fixture(scope="session")
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


def write_shard(settings: Settings, job: str, step: int, path: str, data: bytes) -> None:
    f = shard_file(settings, "ssd", NODE_A, job, step, path)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)


def crc(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


# The bar of one copy: moving (between 0 and 100 %), then past a value (or gone: the copy is done).
BAR = 'tr[data-copy="${copy}"] [role=progressbar]'
MOVING = f"""copy => {{ const b = document.querySelector(`{BAR}`);
    const v = b && +b.getAttribute('aria-valuenow'); return b && v > 0 && v < 100; }}"""
PAST = f"""([copy, first]) => {{ const b = document.querySelector(`{BAR}`);
    return !b || +b.getAttribute('aria-valuenow') > first; }}"""
# The job's row shows step 7 as the recovery point of all three tiers.
EVERYWHERE = """job => { const r = document.querySelector(`tr[data-job="${job}"]`);
    return r && (r.innerText.match(/step 7\\n/g) || []).length === 3; }"""


async def progress(page: Page, copy: str) -> int:
    bar = page.locator(f'tr[data-copy="{copy}"] [role=progressbar]')
    return int(await bar.get_attribute("aria-valuenow", timeout=WAIT_MS) or 0)


async def test_dashboard_shows_a_live_stack_and_retries(
    stack_url: str, browser: Browser, throttled: Settings, catalog: Engine, job: str, shots: Path
) -> None:
    big = os.urandom(SIZE)
    late = b"written after its registration" * 100
    copying, failing = f"{job}-train", f"{job}-late"
    # The operator's token: reads the views, presses retry. The job registers with its own.
    operator = create_token(catalog, "operator", ["read", "operate"])
    trainer = bearer(create_token(catalog, "trainer", [f"train:{job}-"]))
    async with httpx.AsyncClient(base_url=stack_url, headers=trainer) as api:
        write_shard(throttled, copying, 100, "model.bin", big)
        body = manifest(100, [shard("model.bin", size=SIZE, crc=crc(big))])
        assert (await api.post(f"/v1/jobs/{copying}/checkpoints", json=body)).status_code == 201
        body = manifest(7, [shard("a.bin", size=len(late), crc=crc(late))])
        assert (await api.post(f"/v1/jobs/{failing}/checkpoints", json=body)).status_code == 201

        page = await browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # A token in the fragment is kept by the page and never sent to the server.
        await page.goto(f"{stack_url}/#token={operator}")
        await page.locator(f'tr[data-job="{copying}"]').wait_for(timeout=WAIT_MS)
        assert await page.locator(f'tr[data-job="{failing}"]').count() == 1

        # The progress bar of the copy to lustre moves between two refreshes.
        copy = f"{copying}/100/lustre"
        await page.wait_for_function(MOVING, arg=copy, timeout=WAIT_MS)
        first = await progress(page, copy)
        await page.wait_for_function(PAST, arg=[copy, first], timeout=WAIT_MS)

        # The failed checkpoint, with its reason and a retry button; the file appears; retry.
        row = page.locator(f'tr[data-failure="{failing}/7/ssd"]')
        await row.wait_for(timeout=WAIT_MS)
        assert "a.bin (missing)" in await row.inner_text()
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
        write_shard(throttled, failing, 7, "a.bin", late)
        await row.get_by_role("button", name="retry").click()
        await page.locator(f'tr[data-failure^="{failing}/7/"]').first.wait_for(
            state="detached", timeout=WAIT_MS
        )
        # Restorable everywhere: the job's row shows step 7 on every tier.
        await page.wait_for_function(EVERYWHERE, arg=failing, timeout=WAIT_MS)
        states = (await api.get(f"/v1/jobs/{failing}/checkpoints/7")).json()["tiers"]
        assert {t["state"] for t in states} == {"restorable"}

        # One job's checkpoint x tier matrix and a checkpoint's history.
        await page.locator(f'tr[data-job="{failing}"]').click()
        await page.locator('#matrix tr[data-step="7"] .cell.restorable').first.wait_for(
            timeout=WAIT_MS
        )
        await page.locator('#matrix tr[data-step="7"] .cell').first.click()
        events = page.locator("#events")
        await events.wait_for(timeout=WAIT_MS)
        text = await events.inner_text()
        assert "operator_action" in text and "promoted" in text and "operator" in text, text
        await page.screenshot(path=str(shots / "dashboard-checkpoint.png"))
        assert errors == []
        assert operator not in page.url


async def test_without_a_token_the_page_says_how_to_get_one(
    stack_url: str, browser: Browser
) -> None:
    page = await browser.new_page()
    await page.goto(stack_url + "/")
    banner = page.locator("#error")
    await banner.wait_for(state="visible", timeout=WAIT_MS)
    assert "token" in await banner.inner_text()
