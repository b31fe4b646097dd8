"""Applying and checking the Alembic migrations that own the catalog schema."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations
from tierpoint.catalog.engine import normalize_url

MIGRATIONS_DIR = Path(migrations.__file__).parent


class SchemaMismatch(RuntimeError):
    pass


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql+psycopg://"))
    head = script.get_current_head()
    assert head is not None
    return head


def _check(connection: Connection) -> None:
    current = MigrationContext.configure(connection).get_current_revision()
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaMismatch(
            "the catalog database has no tierpoint schema: run `tierpoint migrate` first"
        )
    script = ScriptDirectory.from_config(alembic_config("postgresql+psycopg://"))
    try:
        script.get_revision(current)
    except Exception as exc:
        raise SchemaMismatch(
            f"the catalog schema is at revision {current}, newer than this tierpoint "
            f"(head {head}): upgrade tierpoint before starting it"
        ) from exc
    raise SchemaMismatch(
        f"the catalog schema is at revision {current}, older than head {head}: "
        "run `tierpoint migrate`"
    )


def check_schema(engine: Engine) -> None:
    with engine.connect() as conn:
        _check(conn)


async def check_schema_async(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.run_sync(_check)
