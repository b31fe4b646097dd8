"""Temporal workers: one per node (its local tier: seal, copy, delete expired local copies, scrub,
repair and reconcile it) and the shared one (workflows, shared and S3 tiers, retention, integrity,
the reconciler that starts lifecycles nobody started, and the retention sweep, scrub and
reconciliation schedules)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import PollerBehaviorSimpleMaximum, UnsandboxedWorkflowRunner, Worker

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.peer import PeerActivities
from activities.pull import PullActivities
from activities.rebuild import RebuildActivities
from activities.reconcile import ReconcileActivities
from activities.registration import activities_of
from activities.repair import RepairActivities
from activities.retention import RetentionActivities
from activities.scrub import ScrubActivities
from activities.stores import Stores
from apps.worker_stalls import tolerate_stalls
from apps.worker_threads import shield_thread_starts
from tierpoint import logs, metrics_worker, node_fleet
from tierpoint.catalog.engine import (
    Engine,
    Sessions,
    Transact,
    make_sync_engine,
    sync_sessions,
    transact_in_thread,
)
from tierpoint.catalog.migrate import check_schema
from tierpoint.catalog.node import registry as node_registry
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE, node_task_queue
from tierpoint.services import coded_tiers, data_damage, data_endpoint, stripe_rebuild
from tierpoint.services.lifecycle_start import start_unstarted
from tierpoint.storage.peer_http import pull_tls
from tierpoint.temporal import ensure_integrity_schedules, ensure_sweep_schedule
from workflows.registry import WORKFLOWS

log = logs.get(__name__)

# A node worker refreshes its node row's last_seen this often.
NODE_HEARTBEAT_SECONDS = 15.0
# The reconciler leaves a just-registered checkpoint to the API's own start for this long.
RECONCILE_GRACE = timedelta(seconds=2)
RECONCILE_BATCH = 500
# Batch activities a worker runs at once (each moves one shard at a time).
ACTIVITY_THREADS = 16
# The lifecycle's catalog steps (plan, promote) run as local activities in the shared worker,
# on threads of their own: behind long copies in the same pool a promotion would wait minutes.
LOCAL_ACTIVITY_THREADS = 8
# The catalog connections a worker process holds at most, all of them kept open between uses.
# With the engine's default (8 kept, 16 more closed when returned) a process running tens of
# activity threads opened a new Postgres backend every few dozen transactions (at 200 simulated
# nodes, about one per node per checkpoint), and a backend's start and its cold catalog caches are
# Postgres CPU spent on no statement. The same ceiling as before.
WORKER_CONNECTIONS = 24
# The SDK sends heartbeats to the server at most every 0.8 x the heartbeat timeout by default:
# the server would then see a live copy only just inside its timeout and keep a resume offset up
# to 0.8 x timeout old. Three times per timeout leaves two heartbeats in a row room to be late
# and a retry at most a third of it to copy again. Not more often: each heartbeat is an update of
# the workflow's state on the server, and a child of 250 batches all running, heartbeating ten
# times per timeout (every 6 s), asked the server for 42 of them a second, one at a time; in a
# 1,000-node rehearsal they took 6-10 s each and batches were timed out on their heartbeats.
HEARTBEAT_SENDS_PER_TIMEOUT = 3


def heartbeat_throttle(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.batch_heartbeat_timeout_seconds / HEARTBEAT_SENDS_PER_TIMEOUT)


def node_roots(settings: Settings, node: str) -> dict[str, str]:
    return {t.name: str(t.root_for(node)) for t in settings.tiers if t.on_nodes}


def check_data_tls(settings: Settings) -> None:
    """ValueError, said at start, for a node worker whose mutual TLS cannot work: client
    authentication without the endpoint's TLS or the CA, or without its own client certificate
    (its peers, configured alike, would refuse every pull), or a certificate that does not load.
    A node worker's check, not the settings': the API and the shared worker serve no endpoint."""
    if settings.data_tls_client_auth and (
        settings.data_tls_cert is None or settings.data_tls_ca is None
    ):
        # Without TLS there is no handshake to ask for a certificate in; without a CA the
        # system roots would admit any publicly issued certificate.
        raise ValueError(
            "data_tls_client_auth needs TIERPOINT_DATA_TLS_CERT/TIERPOINT_DATA_TLS_KEY (the "
            "endpoint's TLS) and TIERPOINT_DATA_TLS_CA (the CA that signs the clients' "
            "certificates)"
        )
    if settings.data_tls_client_auth and settings.data_tls_client_cert is None:
        raise ValueError(
            "data_tls_client_auth is on, so the other nodes' data endpoints require a client "
            "certificate too: set TIERPOINT_DATA_TLS_CLIENT_CERT and TIERPOINT_DATA_TLS_CLIENT_KEY "
            "(a certificate for client authentication that TIERPOINT_DATA_TLS_CA signed)"
        )
    if settings.data_tls_client_cert is not None:
        try:
            pull_tls(settings)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load data_tls_client_cert {settings.data_tls_client_cert} with its key "
                f"{settings.data_tls_client_key}: {exc}"
            ) from None


async def _every(
    seconds: float, stop: asyncio.Event, what: str, fn: Callable[[], Awaitable[None]]
) -> None:
    """Run fn now and then every `seconds` until stop; a failing round is logged, not fatal."""
    while not stop.is_set():
        try:
            await fn()
        except Exception as exc:
            # Expected while the catalog or Temporal is away: one line per round, not a traceback.
            log.warning(
                "periodic task failed", task=what, error=f"{type(exc).__name__}: {exc}"[:500]
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


async def reconcile_once(
    client: Client,
    transact: Transact,
    grace: timedelta = RECONCILE_GRACE,
) -> int:
    """Start the lifecycle of every registered checkpoint that has none. Returns how many."""
    started = await start_unstarted(client, transact, older_than=grace, limit=RECONCILE_BATCH)
    for ref in started:
        log.info("reconciler started lifecycle", job=ref.job, step=ref.step)
    return len(started)


def activity_objects(
    sessions: Sessions,
    settings: Settings,
    stores: Stores,
    *,
    node: str | None = None,
    client: Client | None = None,
    rebuilds: stripe_rebuild.RebuildRequests | None = None,
) -> tuple[object, ...]:
    """One object of each activity class, for `node`'s queue or (None) the shared one."""
    return (
        LifecycleActivities(sessions, settings, stores, node=node),
        RetentionActivities(sessions, settings, stores, node=node, client=client),
        ScrubActivities(sessions, settings, stores, node=node, rebuilds=rebuilds),
        RepairActivities(sessions, settings, stores, node=node, client=client, rebuilds=rebuilds),
        ReconcileActivities(sessions, settings, stores, node=node, rebuilds=rebuilds),
        PeerActivities(sessions, settings, stores, node=node),
        EncodeActivities(sessions, settings, stores, node=node),
        PullActivities(sessions, settings, stores, node=node),
        RebuildActivities(sessions, settings, stores, node=node),
    )


def catalog_engine(url: str) -> Engine:
    """The worker's catalog engine: WORKER_CONNECTIONS connections at most, none closed when
    returned."""
    return make_sync_engine(url, pool_size=WORKER_CONNECTIONS, max_overflow=0)


@dataclass(frozen=True)
class _Wiring:
    """What every worker of this process shares."""

    settings: Settings
    client: Client
    sessions: Sessions
    stores: Stores
    executor: ThreadPoolExecutor
    graceful_shutdown: timedelta
    # The nodes' data endpoints started by node_worker, stopped with the workers.
    data_servers: list[data_endpoint.DataServer] = field(default_factory=list)

    def serve_data(self, node: str, nodes: int, repairs: data_damage.RepairRequests) -> str | None:
        """Start `node`'s data endpoint when peers or restores need one; its URL. A copy it finds
        damaged is sent to repair through `repairs`."""
        settings = self.settings
        if not settings.peer_tiers() and settings.data_port is None:
            return None
        if settings.peer_tiers() and settings.data_token is None:
            # Every pull would be refused, and retried for hours: say so at start instead.
            raise ValueError(
                "a peer tier needs the workers' data endpoint credential: set "
                "TIERPOINT_DATA_TOKEN (the same secret on every worker)"
            )
        check_data_tls(settings)
        # One fixed port cannot serve several nodes of one process (the dev stack's).
        port = settings.data_port if settings.data_port is not None and nodes == 1 else 0
        server = data_endpoint.serve(settings, self.sessions, node, port, repairs)
        self.data_servers.append(server)
        log.info("data endpoint served", node=node, url=server.url)
        return server.url

    def stop_data(self) -> None:
        for server in self.data_servers:
            server.shutdown()
            server.server_close()

    def worker(self, task_queue: str, node: str | None, **options: Any) -> Worker:
        shield_thread_starts()
        return tolerate_stalls(
            Worker(
                self.client,
                task_queue=task_queue,
                activities=activities_of(
                    *activity_objects(
                        self.sessions,
                        self.settings,
                        self.stores,
                        node=node,
                        # Only the shared worker's may start workflows (retention, repair requests);
                        # a holder's scrub and reconciliation ask for the rebuild of the stripes
                        # they find bad, as its data endpoint asks for a repair.
                        client=self.client if node is None else None,
                        rebuilds=stripe_rebuild.RebuildRequests(
                            self.client, asyncio.get_running_loop()
                        ),
                    ),
                    node_queue=node is not None,
                ),
                activity_executor=self.executor,
                max_heartbeat_throttle_interval=heartbeat_throttle(self.settings),
                graceful_shutdown_timeout=self.graceful_shutdown,
                # Workflows run outside Temporal's sandbox: the SDK enters it (compiling a
                # snippet of source) for every payload of every activation, a fifth of the
                # workers' CPU in a storm of small checkpoints (docs/benchmarks.md). What it
                # would catch is held by other means: workflows import only the contract (the
                # import contracts), call no clock, randomness or I/O
                # (tests/workflows/test_determinism_rules.py), and every committed history
                # replays under the sandbox (tests/workflows/test_replay.py).
                workflow_runner=UnsandboxedWorkflowRunner(),
                **{"max_concurrent_activities": ACTIVITY_THREADS, **options},
            )
        )

    async def node_workers(
        self, nodes: Sequence[str]
    ) -> tuple[list[Worker], Callable[[], Awaitable[None]]]:
        """The nodes' workers (sized by tierpoint.node_fleet) and their one heartbeat. Each node's
        data endpoint starts first, and the nodes report in before they serve anything:
        registration accepts shards only on known nodes."""
        roots = {n: node_roots(self.settings, n) for n in nodes}
        repairs = data_damage.RepairRequests(self.client, asyncio.get_running_loop())
        data_urls = {
            n: await asyncio.to_thread(self.serve_data, n, len(nodes), repairs) for n in nodes
        }
        domains = {n: self.settings.domain_of(n) for n in nodes}
        report_in = functools.partial(
            node_fleet.report_in, self.sessions, nodes, roots, data_urls, domains
        )
        await asyncio.to_thread(report_in)
        size = node_fleet.sizing(len(nodes))
        workers = [
            self.worker(
                node_task_queue(n),
                n,
                max_concurrent_activities=size.slots,
                activity_task_poller_behavior=PollerBehaviorSimpleMaximum(size.pollers),
            )
            for n in nodes
        ]
        return workers, functools.partial(asyncio.to_thread, report_in)

    def check_codes(self) -> None:
        """ValueError, said at start, for coded peer tiers this process must not run with
        (tierpoint.services.coded_tiers): the shared worker places them."""
        if coded_tiers.coded(self.settings):
            with self.sessions.begin() as s:
                coded_tiers.check(self.settings, node_registry.known_count(s))

    async def shared_worker(self) -> Worker:
        settings = self.settings
        await asyncio.to_thread(self.check_codes)
        # Periodic retention for time-based rules; idempotent, so every shared worker does it.
        await ensure_sweep_schedule(self.client, settings.retention_sweep_interval)
        await ensure_integrity_schedules(
            self.client,
            settings.scrub_interval if settings.scrub_enabled else None,
            settings.reconcile_schedule_interval,
        )
        return self.worker(
            SHARED_TASK_QUEUE,
            None,
            workflows=list(WORKFLOWS),
            max_concurrent_local_activities=LOCAL_ACTIVITY_THREADS,
        )


async def run_workers(
    settings: Settings,
    client: Client,
    *,
    nodes: Sequence[str],
    shared: bool,
    stop: asyncio.Event,
    graceful_shutdown: timedelta = timedelta(seconds=5),
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Run a worker per node on its node queue and, if `shared`, the shared worker with the
    workflows, the shared/S3 activities and the reconciler, until `stop` is set.

    Refuses to start (raises SchemaMismatch) when the catalog schema is not at this code's head.
    On stop, running activities get `graceful_shutdown` to finish; the ones that do not are
    cancelled and resume from their last heartbeat on the next worker. With `metrics_port`, the
    worker metrics (tierpoint.metrics_worker) are served on <metrics_host>:<port>/metrics while the
    workers run.
    """
    if not nodes and not shared:
        raise ValueError("nothing to run: give nodes and/or shared=True")
    engine = catalog_engine(settings.database_url)
    metrics_server = None
    try:
        await asyncio.to_thread(check_schema, engine)
        if metrics_port is not None:
            metrics_server = metrics_worker.serve(metrics_port, metrics_host)
            log.info("worker metrics served", host=metrics_host, port=metrics_server.server_port)
        threads = node_fleet.sizing(len(nodes)).threads + (
            ACTIVITY_THREADS + LOCAL_ACTIVITY_THREADS
        ) * int(shared)
        executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tierpoint-activity")
        wiring = _Wiring(
            settings,
            client,
            sync_sessions(engine),
            Stores(settings, threads),
            executor,
            graceful_shutdown,
        )
        try:
            await _run(wiring, nodes, shared, stop)
        finally:
            await asyncio.to_thread(wiring.stop_data)
            executor.shutdown(wait=False, cancel_futures=True)
    finally:
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.shutdown)
            metrics_server.server_close()
        engine.dispose()


async def _run(
    wiring: _Wiring,
    nodes: Sequence[str],
    shared: bool,
    stop: asyncio.Event,
) -> None:
    """Build the workers and their loops, run them until `stop` (or until a worker dies), and
    shut them down."""
    workers: list[Worker] = []
    loops: list[tuple[float, str, Callable[[], Awaitable[None]]]] = []
    if nodes:
        workers, report_in = await wiring.node_workers(nodes)
        loops.append((NODE_HEARTBEAT_SECONDS, "node heartbeat", report_in))
    if shared:
        workers.append(await wiring.shared_worker())

        # The reconciler shares the activities' sync engine: its two facts (which checkpoints have
        # no lifecycle, "this one has one now") are the API's too, written once.
        transact = transact_in_thread(wiring.sessions)

        async def reconcile() -> None:
            await reconcile_once(wiring.client, transact)

        loops.append((wiring.settings.reconcile_interval_seconds, "reconciler", reconcile))

    # Our own event, so a crashed worker stops our loops without touching the caller's `stop`.
    halt = asyncio.Event()
    tasks = [asyncio.create_task(w.run()) for w in workers]
    running = [asyncio.create_task(_every(every, halt, what, fn)) for every, what, fn in loops]
    log.info("workers running", nodes=list(nodes), shared=shared)
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t in done and t.exception() is not None:
                raise RuntimeError("a worker stopped unexpectedly") from t.exception()
    finally:
        halt.set()
        stopped.cancel()
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        await asyncio.gather(*tasks, *running, return_exceptions=True)
        log.info("workers stopped", nodes=list(nodes), shared=shared)
