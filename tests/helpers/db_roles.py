"""The two database roles of docs/deployment.md ("Postgres roles"), made on the test's Postgres
by running the doc's SQL as written, with role and database names unique to the test."""

from __future__ import annotations

import re
import textwrap
import uuid
from dataclasses import dataclass

import psycopg

from tests.helpers.services import with_database
from tests.helpers.worker_process import REPO
from tierpoint.catalog.engine import normalize_url

DOC = REPO / "docs" / "deployment.md"


@dataclass(frozen=True)
class Roles:
    owner_url: str
    app_url: str
    app_user: str
    password: str
    database: str


def roles_sql() -> str:
    """The SQL block of "Postgres roles" in docs/deployment.md, as written."""
    text = DOC.read_text()
    section = text[text.index("**Postgres roles.**") :]
    match = re.search(r"```sql\n(.*?)```", section, re.S)
    assert match is not None, "docs/deployment.md lost its roles SQL"
    return textwrap.dedent(match.group(1))


def run_as_written(admin_url: str, sql: str, names: dict[str, str], password: str) -> None:
    """Run the doc's statements (psql's `\\c DB` included) with its names replaced by `names`
    (role and database names unique to this test) and `'...'` by `password`."""
    for old, new in names.items():
        sql = re.sub(rf"\b{old}\b", new, sql)
    sql = sql.replace("'...'", f"'{password}'")
    plain = normalize_url(admin_url).replace("postgresql+psycopg://", "postgresql://")
    conn = psycopg.connect(plain, autocommit=True)
    try:
        statement = ""
        for line in sql.splitlines():
            if line.startswith("\\c "):
                conn.close()
                conn = psycopg.connect(with_database(plain, line.split()[1]), autocommit=True)
                continue
            statement += line + "\n"
            if line.rstrip().endswith(";"):
                conn.execute(statement)
                statement = ""
        assert not statement.strip(), f"an unfinished statement: {statement}"
    finally:
        conn.close()


def _role_url(admin_url: str, user: str, password: str, database: str) -> str:
    base = normalize_url(admin_url)
    rest = base.split("@", 1)[1]
    return with_database(f"postgresql+psycopg://{user}:{password}@{rest}", database)


def make_roles(admin_url: str) -> Roles:
    """The roles and their database on the server of `admin_url` (a superuser's URL)."""
    suffix = uuid.uuid4().hex[:8]
    names = {
        "tierpoint_owner": f"tierpoint_owner_{suffix}",
        "tierpoint_app": f"tierpoint_app_{suffix}",
        "tierpoint": f"tierpoint_roles_{suffix}",
    }
    password = uuid.uuid4().hex
    run_as_written(admin_url, roles_sql(), names, password)
    db = names["tierpoint"]
    return Roles(
        _role_url(admin_url, names["tierpoint_owner"], password, db),
        _role_url(admin_url, names["tierpoint_app"], password, db),
        names["tierpoint_app"],
        password,
        db,
    )
