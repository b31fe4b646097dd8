"""The whole embedded stack in one process: `tierpoint dev`.

Embedded Postgres (data in DIR/postgres), the Temporal dev server (SQLite file DIR/temporal.db),
a moto S3 server (in memory), the catalog migrations, N simulated nodes, the tiers (tiers.py: the
user's list or ssd -> lustre -> s3, roots under DIR unless given), workers for every node plus the
shared worker, and the API. DIR/stack.json and DIR/stack.env tell other programs how to reach it;
both are removed when the stack stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError

from apps.devstack.api_process import ApiProcess
from apps.devstack.env_file import stack_env_text
from apps.devstack.facts import (
    BUCKET,
    DEFAULT_API_PORT,
    DEFAULT_NODES,
    S3Facts,
    StackInfo,
    node_ids,
)
from apps.devstack.ownership import DataDirClaim
from apps.devstack.paths import StackPaths
from apps.devstack.priority import lower_own_priority
from apps.devstack.services import EmbeddedPostgres, MotoS3Server, TemporalDevServer
from apps.devstack.settings import build_settings
from apps.devstack.tiers import DEFAULT_TIERS, complete_tiers, on_stack_s3
from tierpoint import logs
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import catalog_now, make_sync_engine, sync_sessions
from tierpoint.catalog.node import registry as catalog_nodes
from tierpoint.catalog.token import tokens
from tierpoint.config import Settings
from tierpoint.long_lived import freeze_long_lived
from tierpoint.tier_config import TierConfig, TierKind

READY_TIMEOUT = 120.0
# The dev stack's admin token, made anew at every start (the previous one stops working).
DEV_TOKEN_NAME = "dev-admin"

log = logs.get(__name__)


def _write_atomic(path: Path, content: str) -> None:
    """Owner-only: the facts hold the stack's admin token and S3 key."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    tmp.replace(path)


@dataclass
class DevStack:
    data_dir: Path
    api_port: int = DEFAULT_API_PORT
    nodes: list[str] = field(default_factory=lambda: node_ids(DEFAULT_NODES))
    temporal_ui: bool = True
    # The user's tier list as written (tiers.requested_tiers); completed at start.
    tiers: list[dict[str, Any]] = field(default_factory=lambda: [dict(t) for t in DEFAULT_TIERS])
    paths: StackPaths = field(init=False)
    postgres: EmbeddedPostgres = field(init=False)
    temporal: TemporalDevServer = field(init=False)
    moto: MotoS3Server = field(init=False)
    settings: Settings | None = field(default=None, init=False)
    info: StackInfo | None = field(default=None, init=False)
    token: str | None = field(default=None, init=False, repr=False)
    _api_socket: socket.socket | None = field(default=None, init=False, repr=False)
    _claim: DataDirClaim = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.expanduser().resolve()
        self.paths = StackPaths(self.data_dir)
        self.postgres = EmbeddedPostgres(self.paths.postgres)
        self.temporal = TemporalDevServer(
            self.paths.temporal_db,
            ui_port=0 if self.temporal_ui else None,
            detach=True,
            die_with_parent=True,
        )
        self.moto = MotoS3Server(detach=True, die_with_parent=True)
        self._claim = DataDirClaim(self.paths)

    @property
    def temporal_ui_url(self) -> str | None:
        """Known once Temporal has started (its port is chosen then)."""
        ui_port = self.temporal.ui_port
        return f"http://127.0.0.1:{ui_port}" if ui_port else None

    # -- services (blocking; run before the event loop work starts) --------------------------

    def claim_data_dir(self) -> list[str]:
        """One `tierpoint dev` per data dir (ownership.py): raises DataDirBusy while another
        runs; stops what a killed one left and returns what it stopped."""
        stopped = self._claim.acquire(self.postgres)
        # A stack that was killed hard leaves its facts behind; they point at dead ports.
        for stale in (self.paths.stack_json, self.paths.stack_env):
            stale.unlink(missing_ok=True)
        return stopped

    def bind_api(self) -> socket.socket:
        """The API's listening socket, bound before anything starts so a busy port fails fast."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.api_port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(
                f"cannot listen on 127.0.0.1:{self.api_port} ({exc.strerror}): "
                "pass --port with a free port, or --port 0 for any"
            ) from None
        self._api_socket = sock
        return sock

    def start_services(self, step: Callable[[str], None] = lambda _: None) -> None:
        if self._api_socket is None:
            self.bind_api()
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        for tier in complete_tiers(self.tiers, self.paths, len(self.nodes), None):
            if tier.kind is TierKind.LOCAL:
                for node in self.nodes:
                    tier.root_for(node).mkdir(parents=True, exist_ok=True)
            elif tier.kind is TierKind.SHARED:
                tier.root_for(None).mkdir(parents=True, exist_ok=True)

        step("Postgres")
        database_url = self.postgres.start()
        self._claim.record("postgres", self.postgres.pid)
        step("catalog migrations")
        migrate.upgrade(database_url)
        self.token = _admin_token(database_url)
        step("Temporal dev server")
        self.temporal.start(log_file=self.paths.logs / "temporal.log")
        self._claim.record("temporal", self.temporal.pid)
        step("S3 (moto)")
        self.moto.start(log_file=self.paths.logs / "moto.log")
        self._claim.record("moto", self.moto.pid)
        s3 = self._s3_facts()
        tiers = complete_tiers(self.tiers, self.paths, len(self.nodes), s3)
        for bucket in sorted({BUCKET} | {t.bucket or BUCKET for t in tiers if on_stack_s3(t, s3)}):
            self._create_bucket(s3, bucket)
        # The stack's S3 tiers read these (`credentials_env`); a tier of another endpoint keeps
        # the user's AWS chain, which the stack leaves alone.
        os.environ.update(s3.credential_vars())
        self.settings = build_settings(
            database_url=database_url,
            temporal_address=self.temporal.address,
            tiers=tiers,
            api_port=self.api_port,
        )

    def _s3_facts(self) -> S3Facts:
        return S3Facts(
            endpoint_url=self.moto.endpoint_url,
            bucket=BUCKET,
            region=self.moto.region,
            access_key_id=self.moto.access_key_id,
            secret_access_key=self.moto.secret_access_key,
        )

    @staticmethod
    def _create_bucket(s3: S3Facts, bucket: str) -> None:
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint_url,
            region_name=s3.region,
            aws_access_key_id=s3.access_key_id,
            aws_secret_access_key=s3.secret_access_key,
        )
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise

    def stop_services(self) -> None:
        """Stop in reverse order of start; each stop is a no-op for what never started."""
        if self._api_socket is not None:
            self._api_socket.close()
            self._api_socket = None
        self.moto.stop()
        self.temporal.stop()
        self.postgres.stop()
        self._claim.release()

    def remove_facts(self) -> None:
        self.paths.stack_json.unlink(missing_ok=True)
        self.paths.stack_env.unlink(missing_ok=True)

    # -- workers and API (one asyncio loop) --------------------------------------------------

    async def serve(
        self,
        stop: asyncio.Event,
        on_ready: Callable[[StackInfo], None],
        log_level: str = "INFO",
    ) -> None:
        """Run the workers (here) and the API (in a process of its own: api_process.py) until
        `stop` is set, then stop them: API first (no new registrations), then the workers
        (graceful: running activities finish or heartbeat). The workers run at a lower CPU
        priority than the API (priority.py)."""
        from apps.worker import run_workers
        from tierpoint.temporal import connect

        settings = self.settings
        assert settings is not None, "start_services() first"
        client = await connect(settings)
        since = await asyncio.to_thread(self._catalog_now)

        workers_stop = asyncio.Event()
        workers = asyncio.create_task(
            run_workers(settings, client, nodes=self.nodes, shared=True, stop=workers_stop),
            name="workers",
        )
        sock = self._api_socket or self.bind_api()
        self._api_socket = None
        port = sock.getsockname()[1]
        api = ApiProcess(settings, sock, log_level)
        api.start()
        sock.close()  # the API process holds its own copy
        # After the API's fork, which keeps the priority the stack was started with.
        lower_own_priority()
        api_ended = asyncio.create_task(asyncio.to_thread(api.wait), name="api")
        freeze_long_lived()
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            await self._until_ready(api, since, [workers, api_ended, stopping])
            if stop.is_set():
                return
            s3 = self._s3_facts()
            for tier in settings.tiers:
                if on_stack_s3(tier, s3):
                    await _reconcile_s3(client, tier.name)
            self.info = _stack_info(
                settings, self.nodes, f"http://127.0.0.1:{port}", self.token, s3
            )
            self.info = dataclasses.replace(
                self.info, metrics_url=f"http://127.0.0.1:{api.metrics_port}/metrics"
            )
            _write_atomic(self.paths.stack_env, stack_env_text(self.info, settings, self.data_dir))
            _write_atomic(self.paths.stack_json, json.dumps(self.info.to_json(), indent=2) + "\n")
            on_ready(self.info)
            done, _ = await asyncio.wait(
                [workers, api_ended, stopping], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task is workers:
                    task.result()  # a worker crash ends the stack with its error
                if task is not stopping:
                    raise RuntimeError(f"the {task.get_name()} stopped unexpectedly")
        finally:
            self.remove_facts()
            await asyncio.to_thread(api.stop)
            await _settle(api_ended)
            workers_stop.set()
            await _settle(workers)
            stopping.cancel()

    def _catalog_now(self) -> datetime:
        assert self.settings is not None
        engine = make_sync_engine(self.settings.database_url, pool_size=1)
        try:
            with sync_sessions(engine)() as session:
                return catalog_now(session)
        finally:
            engine.dispose()

    def _nodes_reported(self, since: datetime) -> bool:
        assert self.settings is not None
        engine = make_sync_engine(self.settings.database_url, pool_size=1)
        try:
            with sync_sessions(engine)() as session:
                return catalog_nodes.all_seen_since(session, self.nodes, since)
        finally:
            engine.dispose()

    async def _until_ready(
        self, api: ApiProcess, since: datetime, tasks: list[asyncio.Task[Any]]
    ) -> None:
        """The API serves and every node's worker has reported in (so the API accepts its
        shards). A task that ends first (a crash, the API's exit, or a stop request) ends the
        wait."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            for task in tasks:
                if task.done():
                    if task.get_name() == "stop":
                        return
                    task.result()
                    raise RuntimeError(f"the {task.get_name()} stopped while starting")
            if api.serving() and await asyncio.to_thread(self._nodes_reported, since):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stack was not ready within {READY_TIMEOUT:.0f}s")
            await asyncio.sleep(0.2)


def _admin_token(database_url: str) -> str:
    engine = make_sync_engine(database_url, pool_size=1)
    try:
        with sync_sessions(engine)() as session:
            new = tokens.create_token(session, DEV_TOKEN_NAME, ["admin"], None, replace=True)
            session.commit()
            return new.secret
    finally:
        engine.dispose()


def _stack_info(
    settings: Settings, nodes: list[str], api_url: str, token: str | None, s3: S3Facts
) -> StackInfo:
    local = settings.local_tier()
    assert local is not None  # complete_tiers refuses a list without one
    shared = next((t for t in settings.tiers if t.kind is TierKind.SHARED), None)
    return StackInfo(
        api_url=api_url,
        token=token,
        nodes={n: str(local.root_for(n)) for n in nodes},
        shared_root=str(shared.root_for(None)) if shared else None,
        s3=s3,
        tiers=[_tier_fact(t) for t in settings.tiers],
    )


def _tier_fact(tier: TierConfig) -> dict[str, Any]:
    return tier.model_dump(mode="json", exclude_defaults=True)


async def _reconcile_s3(client: Any, tier: str) -> None:
    """moto keeps S3 in memory while the catalog survives a restart: before the stack reports
    ready, every S3 replica whose object is gone is marked lost (so latest restorable stops
    offering s3 for it) and repair copies it back from a tier that still has it."""
    from tierpoint.contract.integrity import ReconcileInput, ReconcileReport
    from tierpoint.temporal import start_reconcile

    wid = await start_reconcile(
        client, ReconcileInput(tier=tier, repair=True), f"dev-start-{uuid.uuid4().hex}"
    )
    try:
        report = await asyncio.wait_for(
            client.get_workflow_handle(wid, result_type=ReconcileReport).result(), READY_TIMEOUT
        )
    except Exception as exc:
        log.warning("s3 reconciliation at start did not finish", tier=tier, error=repr(exc)[:300])
        return
    lost = sum(t.marked for t in report.tiers)
    if lost:
        log.info(
            "s3 objects lost since the last run", replicas=lost, repairs=report.repairs_requested
        )


async def _settle(task: Awaitable[Any]) -> None:
    """Wait for a task to finish during shutdown; its error was already reported or is moot."""
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await task
