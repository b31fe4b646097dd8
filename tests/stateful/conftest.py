"""One real stack for every example of the stateful test (see stack.py): started once per module,
so that an example costs a fresh job name and a token, not a database or a worker start."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from apps.devstack.services import free_port
from tests.helpers.api_process import ApiProcess
from tests.helpers.services import Services, make_bucket, make_settings
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import WorkerProcess
from tests.stateful.stack import Answers, Api, Loop, Stack
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Node
from tierpoint.temporal import connect

# Guards against a hang, not a performance assertion.
START_TIMEOUT = 120.0


def _wait_nodes(database_url: str, nodes: tuple[str, ...], workers: list[WorkerProcess]) -> None:
    """Shards are accepted only on nodes whose worker has reported in."""
    engine = make_sync_engine(database_url, pool_size=1)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            with engine.connect() as conn:
                known = set(conn.scalars(select(Node.id).where(Node.id.in_(nodes))))
            if known == set(nodes):
                return
            for w in workers:
                assert w.alive(), w.output()
            assert time.monotonic() < deadline, f"nodes never reported in: {workers[0].output()}"
            time.sleep(0.2)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def stateful_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stateful")
    suffix = uuid.uuid4().hex[:6]
    nodes = (f"sf-a-{suffix}", f"sf-b-{suffix}")
    for node in nodes:
        (root / "nodes" / node / "ssd").mkdir(parents=True)
    (root / "lustre").mkdir()
    settings = make_settings(
        services, migrated_url, root, make_bucket(services), temporal_namespace
    ).model_copy(
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
    loop = Loop()
    try:
        temporal = loop.run(asyncio.wait_for(connect(settings), START_TIMEOUT))
        # The shared worker creates a schedule at start: only once the namespace is known.
        loop.retrying(lambda: _describe(temporal, temporal_namespace), START_TIMEOUT)
        workers = [
            WorkerProcess(settings, list(nodes), logs / "nodes.log"),
            WorkerProcess(settings, None, logs / "shared.log"),
        ]
        procs += workers
        api_proc = ApiProcess(settings, free_port(), logs / "api.log")
        procs.append(api_proc)
        api_proc.wait_ready()
        _wait_nodes(settings.database_url, nodes, workers)
        tokens = {
            scope: create_token(settings.database_url, f"sf-{scope}-{suffix}", [scope])
            for scope in ("admin", "read", "operate")
        }
        answers = Answers()
        api = Api(api_proc.url, answers)
        yield Stack(settings, api, tokens, nodes, temporal, loop, answers, logs)
    finally:
        for p in procs:
            p.kill()
        loop.close()


async def _describe(client: Client, namespace: str) -> None:
    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
