"""A lease and a retention flip to `expiring` are ordered by the checkpoint row lock: a lease
requested while the flip is in progress waits for it and then sees its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
from sqlalchemy import Engine, text

from tests.helpers.api import seed

WAIT_LIMIT = 60.0  # seconds: only a bound on a hang, never a timing assertion


async def _blocked_on_lock(catalog: Engine, request: asyncio.Task[httpx.Response]) -> None:
    """Until some backend waits for a row lock (the API's) or the request finished without."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT
    while loop.time() < deadline:
        if request.done():
            raise AssertionError(f"answered without waiting for the lock: {request.result().text}")
        with catalog.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the request neither waited for the lock nor answered")


async def _while_expiring(
    catalog: Engine, job: str, step: int, tier: str, call: Awaitable[httpx.Response]
) -> httpx.Response:
    """Run `call` while another transaction, as the retention executor does, holds the
    checkpoint row and has flipped its marker on `tier` to expiring; then commit the flip."""
    conn = catalog.connect()
    try:
        tx = conn.begin()
        cid = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step FOR UPDATE OF c"
            ),
            {"job": job, "step": step},
        ).scalar_one()
        conn.execute(
            text(
                "UPDATE checkpoint_tier SET state = 'expiring' "
                "WHERE checkpoint_id = :c AND tier = :t"
            ),
            {"c": cid, "t": tier},
        )
        request = asyncio.ensure_future(call)
        try:
            await _blocked_on_lock(catalog, request)
        finally:
            tx.commit()
        return await asyncio.wait_for(request, WAIT_LIMIT)
    finally:
        conn.close()


async def test_latest_with_lease_waits_for_an_expiry_and_chooses_another(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20], tiers=("lustre",))
    url = f"/v1/jobs/{job}/checkpoints/latest"
    r = await _while_expiring(catalog, job, 20, "lustre", client.get(url, params={"lease_ttl": 60}))
    assert r.status_code == 200, r.text
    assert r.json()["step"] == 10 and r.json()["lease"]["step"] == 10


async def test_lease_waits_for_an_expiry_and_is_refused(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    url = f"/v1/jobs/{job}/checkpoints/10/leases"
    r = await _while_expiring(
        catalog, job, 10, "lustre", client.post(url, json={"ttl_seconds": 60})
    )
    assert r.status_code == 409 and r.json()["code"] == "not_leasable"
