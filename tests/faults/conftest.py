"""Fixtures of the fault tests: a Postgres of their own that they may stop and start."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from apps.devstack.services import EmbeddedPostgres
from tests.helpers import tiers
from tests.helpers.services import postgres_root
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine


@pytest.fixture
def dedicated_postgres() -> Iterator[EmbeddedPostgres]:
    """A migrated catalog on a Postgres server of its own, which the test may stop and start."""
    root = postgres_root("tierpoint-fault-pg-")
    pg = EmbeddedPostgres(root / "data", database="tierpoint")
    try:
        with tiers.starting("dedicated_postgres", "a Postgres of its own"):
            pg.start()
        migrate.upgrade(pg.url)
        engine = make_sync_engine(pg.url, pool_size=1)
        try:
            with engine.begin() as conn:
                # Workflows are keyed by checkpoint id: ids far from the session catalog's keep a
                # lifecycle left over in the shared Temporal server from ever matching ours.
                conn.execute(
                    text("SELECT setval(pg_get_serial_sequence('checkpoint', 'id'), :n)"),
                    {"n": random.randint(10**9, 2 * 10**9)},
                )
        finally:
            engine.dispose()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
