"""A job's timeline on the dashboard, in a real browser (Debian's chromium through Playwright)
against a real stack (uvicorn, real workers sealing real files): a job saves steps 10, 20 and 30;
30 is marked bad and 10 good; the job rolls back to 10 and saves 20 again on branch 2; a second
job is forked from step 10. The job's page draws two lanes, the branch point linked to the lane
it left, the superseded checkpoints greyed, the verdicts coloured; the forked job's page links
to its parent job. Screenshots go to TIERPOINT_SCREENSHOTS (default build/screenshots/)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import httpx
import pytest
from playwright.async_api import Browser
from sqlalchemy import Engine
from temporalio.client import Client

from api.app import create_app
from tests.dashboard.test_dashboard import WAIT_MS, browser, shots
from tests.helpers.api import NODE_A, manifest, shard
from tests.helpers.cli import serving
from tests.helpers.lifecycle import running_workers
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

__all__ = ["browser", "shots"]  # the browser tests' fixtures, used here too
WAIT = 120.0  # hang guard only


@pytest.fixture
async def stack_url(
    settings: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[str]:
    async with running_workers(settings, temporal), serving(create_app(settings)) as url:
        yield url


async def _save(
    api: httpx.AsyncClient,
    settings: Settings,
    job: str,
    step: int,
    branch: int = 1,
    **extra: object,
) -> None:
    """A step's file in its branch's own directory on node A's ssd, registered, then sealed."""
    data = f"{job} {step} {branch}".encode() * 50
    directory = str(step) if branch == 1 else f"{step}.b{branch}"
    f = settings.tier("ssd").root_for(NODE_A) / job / directory / "model.bin"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    body = manifest(step, [shard("model.bin", size=len(data), crc=f"{crc32c.crc32c(data):08x}")])
    if branch != 1:
        body["branch"] = branch
    body.update(extra)
    r = await api.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    async with asyncio.timeout(WAIT):
        while True:
            got = await api.get(f"/v1/jobs/{job}/checkpoints/{step}", params={"branch": branch})
            if any(t["tier"] == "ssd" and t["state"] == "restorable" for t in got.json()["tiers"]):
                return
            await asyncio.sleep(0.2)


async def test_a_jobs_page_draws_its_timeline_and_a_fork_links_its_parent(
    stack_url: str, settings: Settings, catalog: Engine, job: str, browser: Browser, shots: Path
) -> None:
    run, child = f"{job}-run", f"{job}-sft"
    operator = create_token(catalog, "operator", ["read", "operate"])
    trainer = bearer(create_token(catalog, "trainer", [f"train:{job}-"]))
    async with httpx.AsyncClient(base_url=stack_url, headers=trainer) as api:
        for step in (10, 20, 30):
            await _save(api, settings, run, step, metadata={"loss": 3.0 / step})
        verdict = {"verdict": "bad", "metric": "loss", "value": "NaN", "at_step": 32}
        r = await api.put(f"/v1/jobs/{run}/checkpoints/30/verdict", json=verdict)
        assert r.status_code == 200, r.text
        r = await api.put(f"/v1/jobs/{run}/checkpoints/10/verdict", json={"verdict": "good"})
        assert r.status_code == 200, r.text
        r = await api.post(f"/v1/jobs/{run}/rollback", json={"step": 10, "from_branch": 1})
        assert r.status_code == 201, r.text
        await _save(api, settings, run, 20, branch=2, parent={"job": run, "step": 10})
        r = await api.post(f"/v1/jobs/{child}/fork", json={"parent": {"job": run, "step": 10}})
        assert r.status_code == 201, r.text
        await _save(api, settings, child, 5, parent={"job": run, "step": 10})

    page = await browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(f"{stack_url}/#token={operator}&job={run}")
    await page.locator("#timeline svg").wait_for(timeout=WAIT_MS)
    assert await page.locator("#timeline .lane").count() == 2
    assert await page.locator("#timeline .lane.current[data-branch='2']").count() == 1
    assert await page.locator("#timeline .branch-link").count() == 1
    marks = page.locator("#timeline circle.mark")

    async def steps(selector: str) -> list[str]:
        found = await page.locator(f"#timeline circle{selector}").all()
        return sorted([await m.get_attribute("data-step") or "" for m in found])

    assert await marks.count() == 4
    assert await steps(".superseded") == ["20", "30"]
    assert await steps(".verdict-good") == ["10"]
    assert await steps(".verdict-bad") == ["30"]
    resaved = page.locator("#timeline circle[data-step='20'][data-branch='2']")
    assert "superseded" not in (await resaved.get_attribute("class") or "")
    await page.locator("#job-panel").screenshot(path=str(shots / "dashboard-timeline.png"))

    # The forked job's page links to its parent job, whose page the link opens.
    await page.goto(f"{stack_url}/#job={child}")
    fork = page.locator(f"#timeline a.fork[data-fork='{run}']")
    await fork.wait_for(timeout=WAIT_MS)
    assert f"forked from {run} @ 10" in (await fork.text_content() or "")
    await page.locator("#job-panel").screenshot(path=str(shots / "dashboard-fork.png"))
    await fork.locator("text").click()  # its label (the box around the link is mostly empty)
    await page.wait_for_function(
        "job => decodeURIComponent(location.hash).includes(`job=${job}`)", arg=run
    )
    assert errors == []
