from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from tests.helpers.services import Services, fresh_database
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Base


@pytest.fixture
def empty_url(services: Services) -> str:
    return fresh_database(services.database_url)


def _tables(url: str) -> set[str]:
    engine = make_sync_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    assert {"checkpoint", "shard", "replica", "checkpoint_tier", "event", "node", "job"} <= _tables(
        empty_url
    )
    migrate.downgrade(empty_url, "base")
    assert _tables(empty_url) <= {"alembic_version"}
    migrate.upgrade(empty_url)
    engine = make_sync_engine(empty_url)
    try:
        migrate.check_schema(engine)
    finally:
        engine.dispose()


def test_models_and_migrations_do_not_drift(migrated_url: str) -> None:
    engine = make_sync_engine(migrated_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_refuses_unmigrated_schema(empty_url: str) -> None:
    engine = make_sync_engine(empty_url)
    try:
        with pytest.raises(migrate.SchemaMismatch, match="tierpoint migrate"):
            migrate.check_schema(engine)
    finally:
        engine.dispose()


def test_refuses_newer_schema(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    engine = create_engine(empty_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'ffff_future'")
        with pytest.raises(migrate.SchemaMismatch, match="newer"):
            migrate.check_schema(engine)
    finally:
        engine.dispose()
