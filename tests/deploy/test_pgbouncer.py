"""The API and the workers through a real PgBouncer in transaction mode, configured by the file
the manifests ship (deploy/kubernetes/pgbouncer/pgbouncer.ini), in front of the catalog of the
two database roles: registration, a lifecycle to every tier, retention expiring copies, and a
restore all work, and Postgres never sees more connections of the application role than the
pooler's `max_db_connections`, however many the processes open.

Debian's PgBouncer is 1.18, older than the 1.21 that carries prepared statements across server
connections: the catalog URL says `prepare_threshold=none`, as docs/deployment.md says for it
(without it psycopg prepares a statement on one server connection and runs it on another)."""

from __future__ import annotations

import asyncio
import configparser
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from tierpoint_client import build_manifest

from tests.client.conftest import _running_stack
from tests.deploy.test_database_roles import _migrate
from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.db_roles import Roles, make_roles
from tests.helpers.pgbouncer import INI, PgBouncer
from tests.helpers.services import Services
from tierpoint.catalog.engine import make_sync_engine, normalize_url

WAIT = 300.0  # hang guard only


def _shipped(key: str) -> int:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(INI.read_text())
    return int(parser["pgbouncer"][key])


class ServerConnections:
    """The most connections of one role Postgres held at once, sampled until stopped."""

    def __init__(self, admin_url: str, user: str) -> None:
        self.url = normalize_url(admin_url).replace("postgresql+psycopg://", "postgresql://")
        self.user = user
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (self.user,)
                ).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self.samples += 1
                self._stop.wait(0.05)

    def __enter__(self) -> ServerConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# A PgBouncer of your own instead of the one the test starts: HOST:PORT, in transaction mode,
# forwarding any database (`* = host=... port=...`) to the Postgres of the test session
# (TIERPOINT_TEST_DATABASE_URL), and admitting its roles (e.g. `auth_query`).
EXTERNAL = "TIERPOINT_TEST_PGBOUNCER_ADDRESS"


@pytest.fixture
def pooled(services: Services, tmp_path: Path) -> Iterator[tuple[Roles, str]]:
    """The two roles' catalog, migrated by the owner directly, and the application's URL through
    PgBouncer (Debian's, started with the shipped pgbouncer.ini, or the one EXTERNAL names)."""
    roles = make_roles(services.database_url)
    migrated = _migrate(roles.owner_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    bouncer: PgBouncer | None = None
    address = os.environ.get(EXTERNAL)
    if not address:
        bouncer = PgBouncer(tmp_path / "pgbouncer")
        bouncer.start(roles.database, roles.app_url, {roles.app_user: roles.password})
        address = f"127.0.0.1:{bouncer.port}"
    try:
        url = (
            f"postgresql+psycopg://{roles.app_user}:{roles.password}@{address}/"
            f"{roles.database}?prepare_threshold=none"
        )
        yield roles, url
    finally:
        if bouncer is not None:
            bouncer.stop()


async def _expire_fast_tiers(stack: Stack, job: str) -> None:
    spec = {"kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}}}
    headers = {"authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as http:
        r = await http.post("/v1/policies", json={"name": f"keep1-{job}", "spec": spec})
        assert r.status_code == 201, r.text
        r = await http.put(f"/v1/jobs/{job}/policy", json={"policy": f"keep1-{job}"})
        assert r.status_code == 200, r.text


async def test_api_and_workers_through_pgbouncer_in_transaction_mode(
    pooled: tuple[Roles, str], services: Services, temporal_namespace: str, tmp_path: Path
) -> None:
    roles, url = pooled
    with ServerConnections(services.database_url, roles.app_user) as seen:
        async with _running_stack(
            services, url, temporal_namespace, tmp_path / "stack", ("node-a", "node-b")
        ) as stack:
            job, node = f"pooled-{uuid.uuid4().hex[:8]}", stack.nodes[0]
            shards: dict[int, dict[str, bytes]] = {}
            for step in (1, 2):
                local = stack.local_dir(node, job, step)
                shards[step] = write_shards(local, {"a.distcp": 2 * 1024 * 1024, "b": 10})
                manifest = build_manifest(local, node)
                await asyncio.to_thread(stack.client.register_manifest, job, step, manifest)
                for tier in ("lustre", "s3"):
                    await asyncio.to_thread(
                        stack.client.wait_restorable, job, step, tier, WAIT, 0.2
                    )
            await _expire_fast_tiers(stack, job)
            deadline = time.monotonic() + WAIT
            while True:
                cp = await asyncio.to_thread(stack.client.checkpoint, job, 1)
                states = {t.tier: t.state for t in cp.tiers}
                if states["ssd"] == states["lustre"] == "expired":
                    break
                assert time.monotonic() < deadline, states
                await asyncio.sleep(0.2)
            assert states["s3"] == "restorable"
            await asyncio.to_thread(stack.client.restore, job, tmp_path / "restored")
            assert read_tree(tmp_path / "restored") == shards[2]
    assert seen.samples > 0 and seen.most > 0
    if not os.environ.get(EXTERNAL):  # the shipped configuration's bound
        assert seen.most <= _shipped("max_db_connections"), seen.most


@pytest.mark.parametrize("setting", ["", "?prepare_threshold=none"])
def test_prepared_statements_and_pgbouncer_older_than_1_21(
    pooled: tuple[Roles, str], setting: str
) -> None:
    """Why the URL setting: psycopg prepares a statement run five times on a connection; in
    transaction mode the next transaction may run on another server connection, which does not
    know it. Without the setting that is an error; with it nothing is ever prepared."""
    _, url = pooled
    if not setting and os.environ.get(EXTERNAL):
        pytest.skip("whether this errs depends on the given PgBouncer's version (1.21+ does not)")
    engine = make_sync_engine(url.split("?")[0] + setting, pool_size=1, max_overflow=0)
    holder = psycopg.connect(
        normalize_url(url.split("?")[0]).replace("postgresql+psycopg://", "postgresql://"),
        prepare_threshold=None,
    )
    try:
        with engine.connect() as conn:
            for _ in range(6):  # prepared on this transaction's server connection
                conn.execute(text("SELECT count(*) FROM job")).scalar()
                conn.commit()
            # Another client holds that server connection in a transaction: the next one of
            # `conn` runs on a new server connection.
            holder.execute("SELECT count(*) FROM job")
            if setting:
                assert conn.execute(text("SELECT count(*) FROM job")).scalar() == 0
            else:
                with pytest.raises(ProgrammingError, match="prepared statement"):
                    conn.execute(text("SELECT count(*) FROM job")).scalar()
    finally:
        holder.close()
        engine.dispose()
