from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import make_sync_engine


@pytest.fixture(scope="module")
def catalog_engine(migrated_url: str) -> Iterator[Engine]:
    engine = make_sync_engine(migrated_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def session(catalog_engine: Engine) -> Iterator[Session]:
    """A session inside a transaction that is rolled back: tests may change shared rows (such as
    the default policy) without other tests seeing it."""
    with catalog_engine.connect() as conn:
        trans = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as s:
            yield s
        trans.rollback()
