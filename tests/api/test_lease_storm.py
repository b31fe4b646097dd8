"""A whole job restarting at once: every rank (or every node's `tierpoint restore`) asks for a
restore lease on the same checkpoint together. Each request is answered 201 without waiting for
another's row lock or for a thread of the API's pool: FastAPI runs a plain-function dependency
in that pool (40 threads), so a request that needs one queues behind every other request that
does, whatever the catalog could answer, and pays two thread switches when it gets one."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import anyio.to_thread
import httpx
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from sqlalchemy import Engine, event

from api.app import create_app
from api.auth import api_routes
from tests.helpers.api import events, running_client, seed
from tests.helpers.expiry_races import lock_waiters
from tierpoint.config import Settings

RANKS = 200
WAIT_LIMIT = 120.0  # seconds: only a bound on a hang, never a timing assertion


@contextmanager
def statements_sent(app: FastAPI) -> Iterator[list[str]]:
    """The statements the app sends to the catalog while the block runs."""
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    engine = app.state.tierpoint.engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def _storm_while_the_pool_is_busy(
    client: httpx.AsyncClient, catalog: Engine, url: str
) -> list[httpx.Response]:
    """`RANKS` lease requests sent at once while other work holds every thread of the pool;
    fails as soon as one of them waits for a thread or a backend waits for a row lock."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    threads = int(limiter.total_tokens)
    loop = asyncio.get_running_loop()
    free, all_busy, holding = threading.Event(), asyncio.Event(), itertools.count(1)

    def hold() -> None:
        if next(holding) == threads:
            loop.call_soon_threadsafe(all_busy.set)
        free.wait()

    busy = [asyncio.ensure_future(anyio.to_thread.run_sync(hold)) for _ in range(threads)]
    deadline = loop.time() + WAIT_LIMIT
    try:
        await asyncio.wait_for(all_busy.wait(), WAIT_LIMIT)
        requests = [
            asyncio.ensure_future(client.post(url, json={"ttl_seconds": 600, "holder": f"r{i}"}))
            for i in range(RANKS)
        ]
        while not all(r.done() for r in requests):
            stats = limiter.statistics()
            assert stats.tasks_waiting == 0, (
                f"{stats.tasks_waiting} lease requests waited for a thread of the API's pool"
            )
            assert lock_waiters(catalog) == 0, "a lease request waited for a row lock"
            assert loop.time() < deadline, "the lease requests neither answered nor waited"
            await asyncio.sleep(0.01)
        return [r.result() for r in requests]
    finally:
        free.set()
        await asyncio.gather(*busy)


async def test_a_restart_storm_of_leases_on_one_checkpoint_is_answered_without_waiting(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    url = f"/v1/jobs/{job}/checkpoints/10/leases"
    answers = await _storm_while_the_pool_is_busy(client, catalog, url)
    assert [r.status_code for r in answers] == [201] * RANKS, [
        r.text for r in answers if r.status_code != 201
    ][:3]
    active = (await client.get(url, params={"limit": 1000})).json()["items"]
    assert sorted(x["holder"] for x in active) == sorted(f"r{i}" for i in range(RANKS))
    assert len({x["id"] for x in active}) == RANKS
    created = [e for e in events(catalog, "leased", job=job) if e["detail"]["action"] == "created"]
    assert len(created) == RANKS


async def test_a_lease_is_two_statements_to_the_catalog_with_its_event(
    settings: Settings, catalog: Engine, job: str, nodes: tuple[str, str]
) -> None:
    """What a lease costs the API is mostly the statements it builds and sends: a lease is the
    checkpoint's row lock, then the lease and its event in one statement (and the check that some
    tier is restorable, read after the lock), whatever a storm's other leases do."""
    app = create_app(settings)
    async for client in running_client(app):
        await seed(client, catalog, job, [10], tiers=("lustre",))
        url = f"/v1/jobs/{job}/checkpoints/10/leases"
        warm = await client.post(url, json={"ttl_seconds": 60})  # the token is cached after it
        assert warm.status_code == 201, warm.text
        with statements_sent(app) as sent:
            r = await client.post(url, json={"ttl_seconds": 600, "holder": "rank-7"})
        assert r.status_code == 201, r.text
        assert len(sent) == 2, sent
    lease = r.json()
    created = [e for e in events(catalog, "leased", job=job) if e["detail"]["action"] == "created"]
    detail = created[-1]["detail"]
    assert (detail["lease_id"], detail["holder"], detail["ttl_seconds"]) == (
        lease["id"],
        "rank-7",
        600,
    )
    expires = datetime.fromisoformat(lease["expires_at"])
    assert datetime.fromisoformat(detail["expires_at"]) == expires


async def test_a_storm_after_a_storm_starts_no_catalog_connection(
    settings: Settings, catalog: Engine, job: str, nodes: tuple[str, str]
) -> None:
    """The API keeps the catalog connections a storm opened: a pool that closed those above its
    first ten when they were returned started a Postgres backend every few dozen requests of a
    storm, for as long as it lasted."""
    app = create_app(settings)
    opened: list[object] = []

    def count(dbapi_connection: Any, _record: Any) -> None:
        opened.append(dbapi_connection)

    async def storm(client: httpx.AsyncClient, url: str) -> None:
        sent = [client.post(url, json={"ttl_seconds": 600}) for _ in range(RANKS)]
        answers = await asyncio.gather(*sent)
        assert [r.status_code for r in answers] == [201] * RANKS

    async for client in running_client(app):
        await seed(client, catalog, job, [10], tiers=("lustre",))
        url = f"/v1/jobs/{job}/checkpoints/10/leases"
        await storm(client, url)  # opens what the storm needs
        engine = app.state.tierpoint.engine.sync_engine
        event.listen(engine, "connect", count)
        try:
            await storm(client, url)
        finally:
            event.remove(engine, "connect", count)
    assert opened == []


def _in_thread_pool(call: Any) -> bool:
    """Whether FastAPI runs `call` (a dependency or an endpoint) in its thread pool."""
    if call is None:
        return False
    own = inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)
    method = inspect.getattr_static(type(call), "__call__", None)
    return not (own or inspect.iscoroutinefunction(method))


def _pooled(dependant: Dependant) -> set[str]:
    found = set()
    for sub in dependant.dependencies:
        if _in_thread_pool(sub.call):
            found.add(getattr(sub.call, "__qualname__", repr(sub.call)))
        found |= _pooled(sub)
    return found


def test_no_route_needs_a_thread_of_the_pool(catalog_settings: Settings) -> None:
    """Every route's endpoint and dependencies run on the event loop (the lease storm above shows
    what one plain function costs)."""
    app = create_app(catalog_settings)
    routes = api_routes(app)
    assert routes
    pooled = {
        f"{route.path_format}: {name}"
        for route in routes
        for name in _pooled(route.dependant)
        | ({"the endpoint"} if _in_thread_pool(route.dependant.call) else set())
    }
    assert not pooled, sorted(pooled)[:10]


async def test_a_release_is_three_statements_to_the_catalog_with_its_event(
    settings: Settings, catalog: Engine, job: str, nodes: tuple[str, str]
) -> None:
    """A job's restart releases every lease it took: a release is the lease's row lock, then its
    end with its event in one statement, then (after the commit, in the request's background
    work) whether the checkpoint is still leased."""
    app = create_app(settings)
    async for client in running_client(app):
        await seed(client, catalog, job, [10], tiers=("lustre",))
        url = f"/v1/jobs/{job}/checkpoints/10/leases"
        held = await client.post(url, json={"ttl_seconds": 600, "holder": "rank-7"})
        assert held.status_code == 201, held.text
        lease = held.json()
        with statements_sent(app) as sent:
            # The ASGI transport answers once the background work is done too.
            r = await client.delete(f"{url}/{lease['id']}")
        assert r.status_code == 204, r.text
        assert len(sent) == 3, sent
        ended = (await client.get(url, params={"all": "true"})).json()["items"]
        again = await client.delete(f"{url}/{lease['id']}")
        assert again.status_code == 204, again.text
    assert [(x["id"], x["released_at"] is not None) for x in ended] == [(lease["id"], True)]
    released = [e["detail"] for e in events(catalog, "leased", job=job)]
    assert [d for d in released if d["action"] == "released"] == [
        {"action": "released", "lease_id": lease["id"]}
    ]
