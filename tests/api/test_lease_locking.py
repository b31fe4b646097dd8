"""A lease and a retention flip to `expiring` are ordered by the checkpoint row lock: a lease
requested while the flip is in progress waits for it and then sees its outcome. Leases (and
restores, which take one) on one checkpoint do not wait for each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.api import seed
from tierpoint.catalog.holds.leases import create_lease

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


async def _answered_while_open(
    catalog: Engine, job: str, step: int, call: Awaitable[httpx.Response]
) -> httpx.Response:
    """Send `call` while another restore's lease on (job, step) is taken and not yet committed,
    as when every node of a job restarts at once; fails as soon as the request waits for a row
    lock instead of answering."""
    with Session(catalog) as other:
        create_lease(other, job, step, 60, "another node", "test")
        request = asyncio.ensure_future(call)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_LIMIT
        while not request.done():
            with catalog.connect() as conn:
                waiting = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                ).scalar_one()
            if waiting:
                other.rollback()
                await asyncio.wait_for(request, WAIT_LIMIT)
                raise AssertionError("the request waited for another restore's lease")
            if loop.time() > deadline:
                raise AssertionError("the request neither answered nor waited for a lock")
            await asyncio.sleep(0.02)
        other.commit()
    return request.result()


async def test_leases_on_one_checkpoint_do_not_wait_for_each_other(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    url = f"/v1/jobs/{job}/checkpoints/10/leases"
    r = await _answered_while_open(catalog, job, 10, client.post(url, json={"ttl_seconds": 60}))
    assert r.status_code == 201, r.text
    active = (await client.get(url)).json()["items"]
    assert {x["holder"] for x in active} == {"another node", None}


async def test_restores_of_one_checkpoint_do_not_wait_for_each_other(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    call = client.post(f"/v1/jobs/{job}/restores", json={"ttl_seconds": 60})
    r = await _answered_while_open(catalog, job, 10, call)
    assert r.status_code == 201, r.text
    assert r.json()["step"] == 10 and r.json()["lease"]["active"]
