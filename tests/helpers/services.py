"""Real services of the test session and what builds on them: fresh databases, Temporal
namespaces per test module, buckets, and Settings for a three-tier store."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg
import uvicorn
from temporalio.client import Client

from apps.devstack.services import MotoS3Server
from tierpoint.catalog.engine import normalize_url
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

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
    namespaces: frozenset[str]  # Temporal namespaces registered for test modules


def docker_reachable() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")


# A test Postgres keeps its data in RAM where the machine has room: a database copy there took
# 0.08-0.14 s against 0.3-1.6 s on disk, and the server's start, stop and removal 2-3x less, on a
# busy two-core machine. Its data is thrown away at the end of the session anyway.
RAM_DIR = Path("/dev/shm")
RAM_NEEDED = 2 * 1024**3


def postgres_root(prefix: str) -> Path:
    """A new directory for an embedded Postgres server's data dir: in RAM when there is room,
    else in the system's temp dir. Outside pytest's basetemp: pytest re-chmods that tree to 0700
    when another session starts, which would lock the server's own user (when tests run as root)
    out of its data dir."""
    ram = RAM_DIR.is_dir() and os.access(RAM_DIR, os.W_OK)
    parent = RAM_DIR if ram and shutil.disk_usage(RAM_DIR).free > RAM_NEEDED else None
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    root.chmod(0o755)
    return root


def _libpq(url: str) -> str:
    return normalize_url(url).replace("postgresql+psycopg://", "postgresql://")


def tune_for_tests(admin_url: str) -> None:
    """Settings of a throwaway server the suite started itself (never one it was given): a small
    WAL, since every database copy is written to the WAL and the data dir may be in RAM."""
    with psycopg.connect(_libpq(admin_url), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_wal_size = '128MB'")
        conn.execute("ALTER SYSTEM SET min_wal_size = '32MB'")
        conn.execute("SELECT pg_reload_conf()")


def drop_database(url: str) -> None:
    """Drop the database of `url`, ending whatever is still connected to it."""
    plain = _libpq(url)
    name = plain.partition("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(with_database(plain, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_database(admin_url: str, *, template: bool = False) -> str:
    """A new database on the server of `admin_url`: empty, or with `template` a copy of that
    database (which nobody may be connected to), so runs and modules never see each other's rows."""
    name = f"tierpoint_test_{uuid.uuid4().hex[:10]}"
    url = normalize_url(admin_url)
    plain = _libpq(url)
    source = plain.partition("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(with_database(plain, "postgres"), autocommit=True) as conn:
        clause = f' TEMPLATE "{source}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{clause}')
    return with_database(url, name)


TESTS = Path(__file__).resolve().parents[1]


def namespace_for(module_file: str | os.PathLike[str]) -> str:
    """The Temporal namespace of a test module, e.g. `t.workflows.test_lifecycle`."""
    rel = Path(module_file).resolve().relative_to(TESTS).with_suffix("")
    return "t." + ".".join(rel.parts)


def all_namespaces() -> list[str]:
    return sorted(namespace_for(p) for p in TESTS.rglob("test_*.py"))


def ensure_namespaces(address: str, names: Sequence[str]) -> None:
    """Register the namespaces on a server the suite did not start (idempotent)."""
    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
    from temporalio.service import RPCError

    async def register() -> None:
        client = await Client.connect(address)
        for name in names:
            try:
                await client.workflow_service.register_namespace(
                    RegisterNamespaceRequest(
                        namespace=name,
                        workflow_execution_retention_period=Duration(seconds=86400),
                    )
                )
            except RPCError as exc:
                if "already" not in str(exc).lower():
                    raise

    asyncio.run(register())


def s3_client(services: Services) -> Any:
    """A boto3 S3 client of the session's endpoint, with its credentials."""
    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.s3_region,
        aws_access_key_id=services.s3_access_key_id,
        aws_secret_access_key=services.s3_secret_access_key,
    )


def make_bucket(services: Services) -> str:
    bucket = f"tp-{uuid.uuid4().hex[:12]}"
    s3_client(services).create_bucket(Bucket=bucket)
    return bucket


def make_settings(
    services: Services,
    database_url: str,
    root: Path,
    bucket: str,
    namespace: str = "default",
) -> Settings:
    """Settings for a three-tier store (ssd -> lustre -> s3) rooted under `root`."""
    return Settings(
        database_url=database_url,
        temporal_address=services.temporal_address,
        temporal_namespace=namespace,
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
        # The API's /metrics listener on a free port (tests.helpers.api.scrape_api reads it).
        api_metrics_port=0,
    )


# Nothing listens on port 1 of the loopback: a connection there is refused at once.
NOWHERE = "127.0.0.1:1"


def catalog_only_settings(database_url: str, root: Path) -> Settings:
    """Settings for a three-tier store rooted under `root` whose Temporal address and S3 endpoint
    lead nowhere: for tests that need only the catalog and files."""
    nowhere = Services(
        database_url, NOWHERE, f"http://{NOWHERE}", "none", "none", "us-east-1", None, frozenset()
    )
    return make_settings(nowhere, database_url, root, "no-s3-in-this-test")


def with_tier(settings: Settings, name: str, **changes: Any) -> Settings:
    """`settings` with tier `name` changed (a read limit, say), every other tier as it is."""
    tiers = [t.model_copy(update=changes) if t.name == name else t for t in settings.tiers]
    return settings.model_copy(update={"tiers": tiers})


class InProcessServer:
    """An ASGI app served by uvicorn on a thread of the test's own process, on a 127.0.0.1 port
    whose socket is held from the pick on: a port picked, released and bound later was once taken
    in between by the app's own metrics endpoint, bound to port 0."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    async def start(self) -> str:
        """Serving (lifespan included); returns its URL."""
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the API server exited while starting")
            await asyncio.sleep(0.05)
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def idle(self) -> bool:
        # uvicorn runs each request, its background tasks included, as one task of this set.
        return not self.server.server_state.tasks

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join)
        self.socket.close()
