"""One real stack for every example of the stateful test (see stack.py): started once per module,
so that an example costs a fresh job name and a token, not a database or a worker start.

Four nodes: two write shards, two only hold peer copies. The peer tier keeps two copies of every
node's files (`copies = 2`: tiers `peer` and `peer.2`) on the ring of sorted node ids, so the
first writer's copies go to the second writer and a holder, the second writer's to the two
holders; with one node lost there is still a node for each copy made again."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from apps.devstack.services import free_port
from tests.helpers.api_process import ApiProcess
from tests.helpers.services import Services, make_bucket, make_settings
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import WorkerProcess
from tests.stateful.holders import Holders
from tests.stateful.stack import Answers, Api, Loop, Stack
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Node
from tierpoint.config import Settings
from tierpoint.temporal import connect
from tierpoint.tier_config import TierConfig, TierKind

# Guards against a hang, not a performance assertion.
START_TIMEOUT = 120.0
WRITERS = ("a", "b")
HOLDERS = ("c", "d")
DATA_TOKEN = "tp_worker-credential-of-the-stateful-test"


def _wait_nodes(database_url: str, nodes: tuple[str, ...], alive: Callable[[], str | None]) -> None:
    """Shards are accepted only on nodes whose worker has reported in, and peers pull only from
    nodes that serve a data endpoint. `alive` says what died (None: nothing)."""
    engine = make_sync_engine(database_url, pool_size=1)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            with engine.connect() as conn:
                known = set(
                    conn.scalars(
                        select(Node.id).where(Node.id.in_(nodes), Node.data_url.is_not(None))
                    )
                )
            if known == set(nodes):
                return
            dead = alive()
            assert dead is None, dead
            assert time.monotonic() < deadline, f"nodes never reported in: {sorted(known)}"
            time.sleep(0.2)
    finally:
        engine.dispose()


def _with_peer_tier(settings: Settings, root: Path) -> Settings:
    """ssd -> peer (copies = 2) -> lustre -> s3, the workers' data endpoint credential."""
    ssd, *rest = settings.tiers
    peer = TierConfig(
        name="peer", kind=TierKind.PEER, root=str(root / "nodes" / "{node}" / "peer"), copies=2
    )
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, peer, *rest], "data_token": DATA_TOKEN}
    )


@pytest.fixture(scope="module")
def stateful_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stateful")
    suffix = uuid.uuid4().hex[:6]
    writers = tuple(f"sf-{x}-{suffix}" for x in WRITERS)
    holding = tuple(f"sf-{x}-{suffix}" for x in HOLDERS)
    nodes = writers + holding
    for node in nodes:
        (root / "nodes" / node / "ssd").mkdir(parents=True)
        (root / "nodes" / node / "peer").mkdir(parents=True)
    (root / "lustre").mkdir()
    base = make_settings(services, migrated_url, root, make_bucket(services), temporal_namespace)
    settings = _with_peer_tier(base, root).model_copy(
        update={
            # Reconciliation looks at everything at once (nothing is too young to judge); the
            # scrub stays out of the way (verify is one of the machine's own actions).
            "reconcile_grace": timedelta(0),
            "token_cache_seconds": 0.0,
        }
    )
    logs = root / "logs"
    logs.mkdir()
    procs: list[WorkerProcess | ApiProcess] = []
    holders: Holders | None = None
    loop = Loop()
    try:
        temporal = loop.run(asyncio.wait_for(connect(settings), START_TIMEOUT))
        # The shared worker creates a schedule at start: only once the namespace is known.
        loop.retrying(lambda: _describe(temporal, temporal_namespace), START_TIMEOUT)
        workers = [
            WorkerProcess(settings, list(writers), logs / "writers.log"),
            WorkerProcess(settings, None, logs / "shared.log"),
        ]
        procs += workers
        holders = started = Holders(settings, holding, logs)
        api_proc = ApiProcess(settings, free_port(), logs / "api.log")
        procs.append(api_proc)
        api_proc.wait_ready()

        def dead() -> str | None:
            gone = [w.output() for w in workers if not w.alive()]
            if not started.alive():
                gone.append(started.output())
            return "\n".join(gone) or None

        _wait_nodes(settings.database_url, nodes, dead)
        tokens = {
            scope: create_token(settings.database_url, f"sf-{scope}-{suffix}", [scope])
            for scope in ("admin", "read", "operate")
        }
        answers = Answers()
        api = Api(api_proc.url, answers, api_proc.log)
        yield Stack(settings, api, tokens, nodes, holders, temporal, loop, answers, logs)
    finally:
        for p in procs:
            p.kill()
        if holders is not None:
            holders.close()
        loop.close()


async def _describe(client: Client, namespace: str) -> None:
    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
