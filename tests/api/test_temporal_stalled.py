"""A Temporal server that accepts connections but answers nothing (SIGSTOP): every request that
needs Temporal answers 503 `temporal_unavailable` (each call has a deadline,
`temporal_rpc_timeout`), never a 500 after the SDK gives up, and what needs only the catalog
(registration, pins, latest) goes on.

The server is the test's own dev server, so that stopping it disturbs no other test."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from api.app import create_app
from apps.devstack.services import TemporalDevServer
from tests.helpers.api import manifest, running_client, seed, set_marker, shard
from tierpoint.config import Settings

# Guards against a hang, not a performance assertion: far above the deadline.
CLIENT_TIMEOUT = 90.0


@pytest.fixture
def own_temporal(tmp_path: Path) -> Iterator[TemporalDevServer]:
    server = TemporalDevServer(db_file=tmp_path / "temporal.db")
    server.start()
    try:
        yield server
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


async def test_a_stalled_temporal_answers_503_and_the_catalog_routes_go_on(
    settings: Settings,
    catalog: Engine,
    nodes: tuple[str, str],
    job: str,
    own_temporal: TemporalDevServer,
) -> None:
    cfg = settings.model_copy(
        update={
            "temporal_address": own_temporal.address,
            "temporal_namespace": "default",
            "temporal_rpc_timeout": 2.0,
        }
    )
    async for client in running_client(create_app(cfg)):
        client.timeout = httpx.Timeout(CLIENT_TIMEOUT)
        await seed(client, catalog, job, [1])
        set_marker(catalog, job, 1, "s3", "failed", reason="test")
        assert own_temporal.pid is not None
        os.kill(own_temporal.pid, signal.SIGSTOP)
        base = f"/v1/jobs/{job}/checkpoints/1"
        for method, url, body in [
            ("POST", f"{base}/retry", None),
            ("POST", f"{base}/verify", {"tier": "lustre"}),
            ("POST", f"{base}/corrupt-copies", {"tier": "lustre", "path": "s1/0", "reason": "x"}),
            ("POST", "/v1/reconcile", {}),
            ("GET", "/v1/reconcile/" + "0" * 32, None),
        ]:
            r = await client.request(method, url, json=body)
            assert r.status_code == 503, (url, r.text)
            assert r.json()["code"] == "temporal_unavailable", (url, r.text)
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(2, [shard("z")]))
        assert r.status_code == 201, r.text
        assert (await client.put(f"{base}/pin")).status_code == 200
        assert (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).status_code == 200
