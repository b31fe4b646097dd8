"""The catalog's engines and its two doors, on a real catalog: every URL form reaches it, the
driver's options the URL names are applied, a unit of work is committed whole or not at all on
either door, statement parameters stay out of error messages, and the catalog's clock is the
transaction's."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import Engine, delete, insert, make_url, select, text
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import (
    IntegrityError,
    async_sessions,
    catalog_now,
    ensure_database,
    make_async_engine,
    make_sync_engine,
    normalize_url,
    ping,
    sync_sessions,
    transact_async,
    transact_in_thread,
)
from tierpoint.catalog.models import Node


def test_every_postgres_url_form_becomes_the_one_driver() -> None:
    for url in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"):
        assert normalize_url(url) == "postgresql+psycopg://u@h/db"


def test_prepare_threshold_in_the_url_is_the_drivers_option(migrated_url: str) -> None:
    libpq = migrated_url.replace("postgresql+psycopg://", "postgresql://", 1)
    joined = "&" if "?" in libpq else "?"
    engine = make_sync_engine(f"{libpq}{joined}prepare_threshold=none", pool_size=1)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            assert driver.prepare_threshold is None
    finally:
        engine.dispose()


def _nodes(engine: Engine, *ids: str) -> list[str]:
    with Session(engine) as s:
        return sorted(s.scalars(select(Node.id).where(Node.id.in_(ids))))


async def test_a_unit_of_work_commits_whole_or_not_at_all_on_both_doors(
    catalog_engine: Engine, migrated_url: str
) -> None:
    kept, lost = (f"engine-{uuid.uuid4().hex[:8]}" for _ in range(2))

    def write(node: str, fail: bool) -> Callable[[Session], str]:
        def work(session: Session) -> str:
            session.execute(insert(Node).values(id=node))
            if fail:
                raise RuntimeError("the work failed after its write")
            return node

        return work

    worker = transact_in_thread(sync_sessions(catalog_engine))
    assert await worker(write(kept, False)) == kept
    with pytest.raises(RuntimeError):
        await worker(write(lost, True))
    assert _nodes(catalog_engine, kept, lost) == [kept]

    api_engine = make_async_engine(migrated_url, pool_size=1)
    try:
        await ping(api_engine)
        api = transact_async(async_sessions(api_engine))
        with pytest.raises(RuntimeError):
            await api(write(lost, True))
        assert _nodes(catalog_engine, kept, lost) == [kept]
    finally:
        await api_engine.dispose()
    with Session(catalog_engine) as s, s.begin():
        s.execute(delete(Node).where(Node.id == kept))


def test_statement_parameters_stay_out_of_error_messages(catalog_engine: Engine) -> None:
    node, secret = f"engine-{uuid.uuid4().hex[:8]}", f"http://token-{uuid.uuid4().hex}@host"
    with Session(catalog_engine) as s, s.begin():
        s.execute(insert(Node).values(id=node))
        with pytest.raises(IntegrityError) as duplicate:
            s.execute(insert(Node).values(id=node, data_url=secret))
        s.rollback()
    assert secret not in str(duplicate.value)
    assert "parameters hidden" in str(duplicate.value)


def test_the_catalogs_clock_is_the_transactions_start(session: Session) -> None:
    first = catalog_now(session)
    session.execute(text("SELECT pg_sleep(0.01)"))
    assert catalog_now(session) == first


def test_ensure_database_creates_it_once(migrated_url: str) -> None:
    url = make_url(migrated_url)
    name = f"ensure_{uuid.uuid4().hex[:8]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    ensure_database(admin, name)
    ensure_database(admin, name)  # exists: nothing to do
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,))
        assert found.fetchone() == (1,)
        conn.execute(f'DROP DATABASE "{name}"')
