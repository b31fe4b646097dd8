"""A pin, a lease or a quarantine against a retention expiry of the same checkpoint, in both
orders, made by the catalog's own row locks rather than by timing: the real `begin_expiry` holds
the checkpoint row (and has flipped a copy to `expiring`) while the API request waits for that
row, or the API's catalog function holds it while `begin_expiry` waits. Either the request wins
(the expiry is skipped) or the expiry wins: a pin is then refused naming the tiers being deleted,
since it could not keep them; a lease holds only what is restorable; a quarantine of the
checkpoint still hides it, and says truthfully which copies are going."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.api import events, seed
from tests.helpers.expiry_races import (
    NEWEST_ON_FAST_TIERS,
    TIERS,
    WAIT_LIMIT,
    begin_now,
    during_begin,
    until_waiting,
)
from tests.helpers.retention import create_job
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.holds import leases, pins
from tierpoint.catalog.holds.quarantine import set_quarantine
from tierpoint.catalog.tier_copy.expiry import begin_expiry, finish_expiry
from tierpoint.contract.retention import BeginResult, BeginState


def _checkpoint_id(catalog: Engine, job: str, step: int) -> int:
    with catalog.connect() as conn:
        cid: int = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": step},
        ).scalar_one()
    return cid


def _markers(catalog: Engine, job: str, step: int) -> dict[str, str]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.tier, t.state FROM checkpoint_tier t JOIN job j ON j.id = t.job_id "
                "WHERE j.name = :job AND t.step = :step"
            ),
            {"job": job, "step": step},
        )
        return {tier: state for tier, state in rows}


async def _setup(client: httpx.AsyncClient, catalog: Engine, job: str) -> int:
    await seed(client, catalog, job, [1, 2])
    create_job(sessionmaker(catalog), job, NEWEST_ON_FAST_TIERS)
    return _checkpoint_id(catalog, job, 1)


@asynccontextmanager
async def _api_transaction(catalog: Engine) -> AsyncIterator[AsyncSession]:
    """An API-side catalog transaction, committed when the block ends."""
    engine = make_async_engine(catalog.url.render_as_string(hide_password=False), pool_size=1)
    try:
        async with async_sessions(engine)() as session, session.begin():
            yield session
    finally:
        await engine.dispose()


async def _begin_waiting_for(
    catalog: Engine, job: str, cid: int, take: Callable[[AsyncSession], Awaitable[object]]
) -> BeginResult:
    """`take` runs in an API transaction that holds the row while the begin of step 1's ssd
    expiry waits for it; the transaction commits, then the begin decides."""
    async with _api_transaction(catalog) as s:
        await take(s)
        begin = asyncio.ensure_future(asyncio.to_thread(begin_now, catalog, job, cid, "ssd"))
        await until_waiting(catalog, begin)
    return await asyncio.wait_for(begin, WAIT_LIMIT)


# -- the expiry holds the row first --------------------------------------------------------------


async def test_a_pin_waiting_for_a_begun_expiry_is_refused_naming_the_tiers(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    cid = await _setup(client, catalog, job)
    url = f"/v1/jobs/{job}/checkpoints/1/pin"
    r = await during_begin(catalog, job, cid, "ssd", client.put(url))
    assert r.status_code == 409, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "copy_expiring" and r.json()["tiers"] == ["ssd"]
    # Nothing was pinned, nor recorded as pinned.
    got = (await client.get(f"/v1/jobs/{job}/checkpoints/1")).json()
    assert got["pinned"] is False
    assert not [e for e in events(catalog, "pinned", job=job)]

    # Asked again while the copy is still being deleted (no lock to wait for now): the same.
    again = await client.put(url)
    assert (again.status_code, again.json()["tiers"]) == (409, ["ssd"])
    # A second tier being deleted is named too.
    with Session(catalog) as s:
        assert begin_expiry(s, job, cid, "lustre", TIERS, datetime.now(UTC)).rule is not None
        s.commit()
    assert (await client.put(url)).json()["tiers"] == ["lustre", "ssd"]

    # Once the expiries have finished, the pin keeps what is left, truthfully.
    with Session(catalog) as s:
        assert finish_expiry(s, cid, "ssd") == "expired"
        assert finish_expiry(s, cid, "lustre") == "expired"
        s.commit()
    done = await client.put(url)
    assert done.status_code == 200 and done.json()["changed"] is True
    assert (await client.get(f"/v1/jobs/{job}/checkpoints/1")).json()["pinned"] is True


async def test_a_lease_during_a_begun_expiry_holds_only_what_is_restorable(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    cid = await _setup(client, catalog, job)
    url = f"/v1/jobs/{job}/checkpoints/1/leases"
    r = await during_begin(catalog, job, cid, "ssd", client.post(url, json={"ttl_seconds": 600}))
    # Restorable elsewhere: leased, and the lease keeps those copies...
    assert r.status_code == 201, r.text
    kept = begin_now(catalog, job, cid, "lustre")
    assert kept.state is BeginState.SKIPPED and "leased" in (kept.reason or ""), kept
    # ...while the copy whose deletion had begun goes on going (and, not restorable, is never
    # offered to a restore).
    assert _markers(catalog, job, 1) == {
        "ssd": "expiring",
        "lustre": "restorable",
        "s3": "restorable",
    }


async def test_a_quarantine_during_a_begun_expiry_hides_and_shows_what_goes(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    cid = await _setup(client, catalog, job)
    url = f"/v1/jobs/{job}/checkpoints/1/quarantine"
    tier = await during_begin(
        catalog, job, cid, "ssd", client.post(url, json={"reason": "bad", "tier": "ssd"})
    )
    assert tier.status_code == 409 and tier.json()["code"] == "copy_expiring", tier.text
    whole = await client.post(url, json={"reason": "loss diverged after load"})
    assert whole.status_code == 200, whole.text
    states = {t["tier"]: t["state"] for t in whole.json()["tiers"]}
    assert states == {"ssd": "expiring", "lustre": "restorable", "s3": "restorable"}
    # The operator's quarantine keeps every copy that is not already going.
    kept = begin_now(catalog, job, cid, "lustre")
    assert kept.state is BeginState.SKIPPED and "quarantined" in (kept.reason or ""), kept


# -- the request holds the row first -------------------------------------------------------------


async def test_a_pin_holding_the_row_first_cancels_the_expiry(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    cid = await _setup(client, catalog, job)

    async def pin(s: AsyncSession) -> None:
        assert (await s.run_sync(pins.set_pinned, job, 1, True, actor="test")).changed

    result = await _begin_waiting_for(catalog, job, cid, pin)
    assert result.state is BeginState.SKIPPED and "pinned" in (result.reason or ""), result
    assert _markers(catalog, job, 1)["ssd"] == "restorable"


async def test_a_lease_or_quarantine_holding_the_row_first_cancels_the_expiry(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    cid = await _setup(client, catalog, job)

    async def lease(s: AsyncSession) -> None:
        await s.run_sync(leases.create_lease, job, 1, 600, "test", actor="test")

    result = await _begin_waiting_for(catalog, job, cid, lease)
    assert result.state is BeginState.SKIPPED and "leased" in (result.reason or ""), result

    other = await _setup(client, catalog, f"{job}-q")

    async def quarantine(s: AsyncSession) -> None:
        await s.run_sync(
            set_quarantine, f"{job}-q", 1, "bad", tier="ssd", actor="test", evidence=True
        )

    result = await _begin_waiting_for(catalog, f"{job}-q", other, quarantine)
    assert result.state is BeginState.SKIPPED and "quarantined" in (result.reason or ""), result
    assert _markers(catalog, job, 1)["ssd"] == _markers(catalog, f"{job}-q", 1)["ssd"]
