"""A request that waits too long for a catalog connection (every one of the API's busy, as in a
storm on a starved machine) is answered 503 `catalog_unavailable`, retryable, and writes nothing:
it used to escape as SQLAlchemy's pool timeout, a 500."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

import api.app
from api.app import create_app
from tests.helpers.api import NODE_A, counts, manifest, running_client, shard
from tierpoint.config import Settings


async def test_a_request_that_gets_no_catalog_connection_in_time_is_a_503_and_writes_nothing(
    settings: Settings,
    catalog: Engine,
    job: str,
    nodes: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api.app, "CATALOG_CONNECTIONS", 1)
    monkeypatch.setattr(api.app, "CATALOG_WAIT", 0.5)
    app = create_app(settings)
    async for client in running_client(app):
        before = counts(catalog)
        # The API's only catalog connection, held while the registration asks for one.
        async with app.state.tierpoint.engine.connect():
            r = await client.post(
                f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("model.bin", NODE_A)])
            )
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "catalog_unavailable", r.json()
        assert counts(catalog) == before
        # With the connection back, the same request goes through.
        again = await client.post(
            f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("model.bin", NODE_A)])
        )
        assert again.status_code == 201, again.text
