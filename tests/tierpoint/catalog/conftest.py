"""The catalog's tests: its own repositories and queries on a real migrated Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings


@pytest.fixture(scope="module")
def catalog_engine(migrated_url: str) -> Iterator[Engine]:
    """The module's own catalog, for tests whose transactions must really commit (several
    connections, a lock held by one against another)."""
    engine = make_sync_engine(migrated_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    """The catalog's tests need neither Temporal nor S3 (the catalog tier): a test here that
    needs either builds on `services`, as tests/conftest.py's `settings` does."""
    return catalog_settings
