"""Engines and sessions for the catalog. One DSN form, `postgresql+psycopg://`, serves both the
async engine (API) and the sync engine (workers' activities, which run in threads). The catalog
is sync: every fact is written once, as a function of a `Session`; the API calls it through
`AsyncSession.run_sync`, and `Transact` is the committed unit of work each side reaches it by.
The coroutines here are those doors, the only ones in the catalog.

Statement parameters are kept out of error messages: a failed batch insert would otherwise carry
thousands of rows into logs and into Temporal's activity failure (which then exceeds its size
limit and loses the actual cause).

This module is also the one door through which code outside the catalog names the catalog's
session types and failures: nothing outside `tierpoint.catalog` and `migrations` imports
SQLAlchemy or psycopg (an import-linter contract), so they are re-exported here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Protocol, TypeVar

from sqlalchemy import URL, Engine, create_engine, func, make_url, select, text
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "CATALOG_UNREACHABLE",
    "AsyncEngine",
    "AsyncSession",
    "AsyncSessions",
    "Engine",
    "IntegrityError",
    "NotMigrated",
    "Session",
    "Sessions",
    "Transact",
    "async_sessions",
    "catalog_now",
    "ensure_database",
    "make_async_engine",
    "make_sync_engine",
    "normalize_url",
    "ping",
    "sync_sessions",
    "transact_async",
    "transact_in_thread",
]

Sessions = sessionmaker[Session]
AsyncSessions = async_sessionmaker[AsyncSession]
T = TypeVar("T")

# The driver's "cannot talk to the database" failures, and no connection of the pool freed in
# time (every one busy, as in a storm on a starved machine): the API answers 503, the CLI one line.
CATALOG_UNREACHABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)
# A statement named a table or column the database does not have: the catalog is not migrated.
NotMigrated = ProgrammingError


def normalize_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _driver_url(url: str) -> tuple[URL, dict[str, int | None]]:
    """The URL for SQLAlchemy, and the driver's options that the URL names but libpq does not
    know: `prepare_threshold` (an integer, or `none` to never prepare a statement, which a
    connection pooler in transaction mode older than PgBouncer 1.21 needs: a statement prepared
    on one server connection is unknown to the next; docs/deployment.md, "A connection
    pooler")."""
    parsed = make_url(normalize_url(url))
    if "prepare_threshold" not in parsed.query:
        return parsed, {}
    raw = str(parsed.query["prepare_threshold"]).strip().lower()
    threshold = None if raw in ("", "none") else int(raw)
    return parsed.difference_update_query(["prepare_threshold"]), {"prepare_threshold": threshold}


def make_async_engine(
    url: str, pool_size: int = 10, max_overflow: int = 20, pool_timeout: float = 30.0
) -> AsyncEngine:
    """At most `pool_size + max_overflow` connections; the pool keeps `pool_size` of them open
    between uses and closes every other one when it is returned. A checkout that waits longer
    than `pool_timeout` seconds for one raises PoolTimeout."""
    driver_url, connect_args = _driver_url(url)
    return create_async_engine(
        driver_url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout,
        pool_pre_ping=True,
        hide_parameters=True,
        connect_args=connect_args,
    )


def make_sync_engine(url: str, pool_size: int = 8, max_overflow: int = 16) -> Engine:
    """At most `pool_size + max_overflow` connections; the pool keeps `pool_size` of them open
    between uses and closes every other one when it is returned."""
    driver_url, connect_args = _driver_url(url)
    return create_engine(
        driver_url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        hide_parameters=True,
        connect_args=connect_args,
    )


def async_sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def sync_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


class Transact(Protocol):
    """One unit of work on the catalog: a sync function of a Session, run in its own transaction
    and committed. A fact is written once, sync; a caller on the API's event loop and one on a
    worker's reach it through the two doors below (`AsyncSession.run_sync` or a thread)."""

    async def __call__(self, work: Callable[[Session], T], /) -> T: ...


def transact_async(sessions: AsyncSessions) -> Transact:
    """The API's door: its async engine, the work run through `AsyncSession.run_sync`."""

    async def run(work: Callable[[Session], T], /) -> T:
        async with sessions.begin() as session:
            return await session.run_sync(work)

    return run


def transact_in_thread(sessions: Sessions) -> Transact:
    """A worker's door: its sync engine, the work run in a thread off the event loop."""

    def in_thread(work: Callable[[Session], T]) -> T:
        with sessions.begin() as session:
            return work(session)

    async def run(work: Callable[[Session], T], /) -> T:
        return await asyncio.to_thread(in_thread, work)

    return run


async def ping(engine: AsyncEngine) -> None:
    """One round trip; raises one of CATALOG_UNREACHABLE when the catalog does not answer."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


def catalog_now(session: Session) -> datetime:
    """The catalog's clock (the transaction's start): what every stored timestamp is compared to."""
    now: datetime | None = session.scalar(select(func.now()))
    assert now is not None
    return now


def ensure_database(admin_uri: str, name: str) -> None:
    """Create the database `name` on the server of `admin_uri` (a libpq URI) unless it exists."""
    import psycopg  # only the dev stack needs it, before any engine exists

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
