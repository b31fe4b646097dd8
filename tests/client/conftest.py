"""A real tierpoint stack for the client: the API under uvicorn on a free 127.0.0.1 port (the
stdlib client needs a real HTTP server) and real workers for two nodes plus the shared worker.

Node ids are unique per stack so that its node task queues never meet another module's workers on
the session's shared Temporal server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import SecretStr
from sqlalchemy import select
from tierpoint_client import Client, RetryPolicy

from api.app import create_app
from tests.helpers.client import Stack
from tests.helpers.services import InProcessServer, Services, make_bucket, make_settings
from tests.helpers.stuck import busy_threads
from tests.helpers.tokens import create_token
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.catalog.models import Node
from tierpoint.config import Settings
from tierpoint.temporal import connect
from tierpoint.tier_config import TierConfig, TierKind


async def _wait_nodes_known(settings: Settings, nodes: tuple[str, ...]) -> None:
    """Shards are accepted only on known nodes; node workers insert their row at start."""
    engine = make_sync_engine(settings.database_url, pool_size=1)
    sessions = sync_sessions(engine)

    def known() -> set[str]:
        with sessions() as s:
            return set(s.scalars(select(Node.id).where(Node.id.in_(nodes))))

    try:
        # The catalog is polled: there is no event to wait on across processes.
        while await asyncio.to_thread(known) != set(nodes):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    finally:
        engine.dispose()


@asynccontextmanager
async def _running_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    root: Path,
    names: tuple[str, ...],
    peer: bool = False,
    s3_tier: TierConfig | None = None,
    same_tiers_as: Stack | None = None,
    code: str | None = None,
) -> AsyncIterator[Stack]:
    """`code`: the peer tier (`peer`) keeps stripes of that code instead of copies;
    `s3_tier`: the s3 tier instead of one on the session's moto (another endpoint);
    `same_tiers_as`: the nodes and tiers of that (stopped) stack, on the catalog `migrated_url`."""
    from apps.worker import run_workers

    if same_tiers_as is not None:
        nodes = same_tiers_as.nodes
        settings = same_tiers_as.settings.model_copy(update={"database_url": migrated_url})
    else:
        suffix = uuid.uuid4().hex[:6]
        nodes = tuple(f"{n}-{suffix}" for n in names)
        for node in nodes:
            (root / "nodes" / node / "ssd").mkdir(parents=True)
            (root / "nodes" / node / "peer").mkdir(parents=True)
        (root / "lustre").mkdir()
        settings = make_settings(
            services, migrated_url, root, make_bucket(services), temporal_namespace
        )
    if s3_tier is not None and same_tiers_as is None:
        *fast, _ = settings.tiers
        settings = settings.model_copy(update={"tiers": [*fast, s3_tier]})
    if peer and same_tiers_as is None:
        ssd, *rest = settings.tiers
        copies = TierConfig(
            name="peer", kind=TierKind.PEER, root=str(root / "nodes/{node}/peer"), code=code
        )
        settings = settings.model_copy(
            update={"tiers": [ssd, copies, *rest], "data_token": SecretStr(uuid.uuid4().hex)}
        )

    temporal = await connect(settings)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        run_workers(settings, temporal, nodes=nodes, shared=True, stop=stop)
    )
    api = InProcessServer(create_app(settings))
    try:
        api_url = await api.start()
        await asyncio.wait_for(_wait_nodes_known(settings, nodes), 120)
        token = create_token(settings.database_url)
        client = Client(
            api_url,
            token=token,
            timeout=30,
            retry=RetryPolicy(attempts=4, initial_backoff=0.1),
        )
        metrics_port = api.app.state.metrics_port  # make_settings serves them on a free port
        yield Stack(settings, api_url, client, nodes, token, metrics_port, api.idle, temporal)
    finally:
        stop.set()
        await api.stop()
        await _stopped(workers)


# Running activities get 5 s to finish on stop (run_workers' graceful shutdown); the rest are
# cancelled and return at their next heartbeat.
STOP_WITHIN = 120.0


async def _stopped(workers: asyncio.Task[None]) -> None:
    """The workers' end, or a failure naming what holds them: a worker that never stops would
    otherwise hold the module until pytest's timeout, and say nothing of why."""
    try:
        await asyncio.wait_for(asyncio.shield(workers), STOP_WITHIN)
    except TimeoutError:
        raise RuntimeError(
            f"the stack's workers did not stop within {STOP_WITHIN:.0f} s: {busy_threads()}"
        ) from None


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    root = tmp_path_factory.mktemp("client-stack")
    async with _running_stack(
        services, migrated_url, temporal_namespace, root, ("node-a", "node-b")
    ) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def peer_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """Three nodes (a ring a -> b -> c -> a) and a peer tier after the local one."""
    root = tmp_path_factory.mktemp("client-peer-stack")
    async with _running_stack(
        services, migrated_url, temporal_namespace, root, ("node-a", "node-b", "node-c"), True
    ) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def coded_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """Five nodes and a coded peer tier, rs(2,1), after the local one: each node's files cut
    into two data stripes and a parity stripe held by three other nodes."""
    root = tmp_path_factory.mktemp("client-coded-stack")
    nodes = ("node-a", "node-b", "node-c", "node-d", "node-e")
    async with _running_stack(
        services, migrated_url, temporal_namespace, root, nodes, True, code="rs(2,1)"
    ) as running:
        yield running
