"""Two database roles, rehearsed as docs/deployment.md ("Postgres roles") sets them up: its SQL run
as written on the embedded Postgres (an owner role, an application role without CREATE), the
migrations Job of the example overlay migrating with the URL its Secret key gives it (the
owner's), then the API and the workers running as the application role through a checkpoint's
whole lifecycle and a restore. Since PostgreSQL 15 `PUBLIC` has no CREATE on `public`: the
application role itself cannot migrate, which the first test shows."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from tierpoint_client import build_manifest

from tests.client.conftest import _running_stack
from tests.helpers.client import read_tree, write_shards
from tests.helpers.kustomize import example_overlay, pod_spec, render
from tests.helpers.services import Services, with_database
from tests.helpers.worker_process import REPO
from tierpoint.catalog.engine import normalize_url

DOC = REPO / "docs" / "deployment.md"
WAIT = 300.0  # hang guard only


@dataclass(frozen=True)
class Roles:
    owner_url: str
    app_url: str


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


@pytest.fixture
def roles(services: Services) -> Iterator[Roles]:
    suffix = uuid.uuid4().hex[:8]
    names = {
        "tierpoint_owner": f"tierpoint_owner_{suffix}",
        "tierpoint_app": f"tierpoint_app_{suffix}",
        "tierpoint": f"tierpoint_roles_{suffix}",
    }
    password = uuid.uuid4().hex
    run_as_written(services.database_url, roles_sql(), names, password)
    db = names["tierpoint"]
    yield Roles(
        _role_url(services.database_url, names["tierpoint_owner"], password, db),
        _role_url(services.database_url, names["tierpoint_app"], password, db),
    )


def _migrate(url: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "TIERPOINT_DATABASE_URL": url, "HOME": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "migrate"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _job_database_url(overlay: Path) -> str:
    """The catalog URL the example overlay's migrations Job gets: its secretKeyRef resolved in
    the rendered Secret."""
    objects = render(overlay).objects
    job = next(o for o in objects if o["kind"] == "Job")
    spec = pod_spec(job)
    assert spec is not None
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    ref = env["TIERPOINT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    secret = next(
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"]
    )
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def test_the_application_role_cannot_migrate(roles: Roles) -> None:
    refused = _migrate(roles.app_url)
    assert refused.returncode != 0
    assert "permission denied for schema public" in refused.stdout + refused.stderr


async def test_the_job_migrates_as_owner_and_the_pods_run_as_the_application_role(
    roles: Roles, services: Services, temporal_namespace: str, tmp_path: Path
) -> None:
    overlay = example_overlay(tmp_path / "kustomize", roles.app_url, roles.owner_url)
    job_url = _job_database_url(overlay)
    migrated = await asyncio.to_thread(_migrate, job_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    async with _running_stack(
        services, roles.app_url, temporal_namespace, tmp_path / "stack", ("node-a", "node-b")
    ) as stack:
        job, step, node = f"roles-{uuid.uuid4().hex[:8]}", 1, stack.nodes[0]
        local = stack.local_dir(node, job, step)
        shards = write_shards(local, {"a.distcp": 3 * 1024 * 1024, "b.distcp": 4096})
        manifest = build_manifest(local, node)
        await asyncio.to_thread(stack.client.register_manifest, job, step, manifest)
        for tier in ("lustre", "s3"):
            await asyncio.to_thread(stack.client.wait_restorable, job, step, tier, WAIT, 0.2)
        await asyncio.to_thread(stack.client.restore, job, tmp_path / "restored", tier="s3")
        assert read_tree(tmp_path / "restored") == shards
