"""`tierpoint quarantine` / `tierpoint unquarantine` in their own process against the real API
served by uvicorn on a free local port."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import seed
from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token


async def _run(api_url: str, token: str, *args: str) -> tuple[int, str]:
    r = await run_cli(api_url, *args, token=token)
    return r.exit_code, r.output


async def _latest(client: httpx.AsyncClient, job: str, tier: str | None = None) -> int:
    params = {"tier": tier} if tier else {}
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params=params)
    assert r.status_code == 200, r.text
    step: int = r.json()["step"]
    return step


async def test_quarantine_and_unquarantine(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2], tiers=("lustre", "s3"))
    token = create_token(catalog, scopes=["operate"])

    code, out = await _run(api_url, token, "quarantine", job, "2", "--reason", "NaN after load")
    assert code == 0, out
    assert f"quarantined {job} step 2: NaN after load" in out
    assert await _latest(client, job) == 1

    code, out = await _run(api_url, token, "unquarantine", job, "2")
    assert code == 0 and f"lifted the quarantine of {job} step 2" in out, out
    assert await _latest(client, job) == 2

    code, out = await _run(
        api_url, token, "quarantine", job, "2", "--reason", "bad", "--tier", "lustre"
    )
    assert code == 0 and "quarantined: bad" in out, out
    assert await _latest(client, job, "lustre") == 1
    code, out = await _run(api_url, token, "unquarantine", job, "2", "--tier", "lustre")
    assert code == 0 and "quarantined: bad" not in out, out
    assert await _latest(client, job, "lustre") == 2

    code, out = await _run(api_url, token, "quarantine", job, "9", "--reason", "x")
    assert code == 1 and "checkpoint_not_found" in out, out
    code, out = await _run(
        api_url, token, "quarantine", job, "2", "--reason", "x", "--tier", "nvme"
    )
    assert code == 1 and "unknown_tier" in out, out


async def test_the_messages_say_what_happened(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """Lifting a quarantine that is not there says so; a quarantined checkpoint's tier table
    does not show its copies as plainly restorable."""
    await seed(client, catalog, job, [1], tiers=("lustre",))
    token = create_token(catalog, scopes=["operate", "read"])

    code, out = await _run(api_url, token, "unquarantine", job, "1")
    assert code == 0, out
    assert "was not quarantined: nothing to lift" in out and "lifted" not in out, out

    code, out = await _run(api_url, token, "quarantine", job, "1", "--reason", "NaN after load")
    assert code == 0, out
    assert "restorable (quarantined)" in out, out
    assert "checkpoint quarantined: NaN after load" in out, out
    code, out = await _run(api_url, token, "unquarantine", job, "1")
    assert code == 0 and f"lifted the quarantine of {job} step 1 (NaN after load)" in out, out
