"""Fixtures for API tests: the real app (lifespan included) over httpx's ASGI transport, on the
session's migrated Postgres and Temporal dev server; catalog helpers that set replica and marker
rows directly, as the workflow would."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, text
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from api.app import create_app
from tests.conftest import Services
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.nodes import upsert_node
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import workflow_id

NODE_A, NODE_B = "node-a", "node-b"
COUNTED_TABLES = ("job", "checkpoint", "shard", "checkpoint_tier", "replica", "event")


@pytest.fixture(scope="module")
def catalog(migrated_url: str) -> Iterator[Engine]:
    engine = make_sync_engine(migrated_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def nodes(catalog: Engine) -> tuple[str, str]:
    from sqlalchemy.orm import Session

    with Session(catalog) as s:
        known = set(s.scalars(text("SELECT id FROM node WHERE id IN ('node-a', 'node-b')")))
        for n in (NODE_A, NODE_B):
            # Workers of other tests in this session may own these rows: never rewrite them.
            if n not in known:
                upsert_node(s, n, {})
        s.commit()
    return NODE_A, NODE_B


@pytest.fixture(scope="module")
async def temporal(services: Services, temporal_namespace: str) -> Client:
    return await Client.connect(
        services.temporal_address,
        namespace=temporal_namespace,
        data_converter=pydantic_data_converter,
    )


@pytest.fixture
async def job(temporal: Client, catalog: Engine) -> AsyncIterator[str]:
    """A fresh job name; afterwards its workflows are terminated and its rows deleted (names that
    extend it included), so that workers and reconcilers of other tests in the session never see
    checkpoints whose shards exist nowhere."""
    name = f"job-{uuid.uuid4().hex[:12]}"
    yield name
    async for wf in temporal.list_workflows(f"WorkflowId STARTS_WITH 'checkpoint/{name}'"):
        with contextlib.suppress(Exception):
            await temporal.get_workflow_handle(wf.id).terminate("api test finished")
    with catalog.begin() as conn:
        conn.execute(text("DELETE FROM job WHERE name LIKE :prefix"), {"prefix": name + "%"})


async def running_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tierpoint") as client:
            yield client


@pytest.fixture
async def client(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async for c in running_client(create_app(settings)):
        yield c


async def workflow_count(temporal: Client, job: str, step: int) -> int:
    wid = workflow_id(job, step)
    return len([wf async for wf in temporal.list_workflows(f"WorkflowId = '{wid}'")])


def shard(
    path: str, node: str = NODE_A, size: int = 10, crc: str | None = "0badf00d"
) -> dict[str, Any]:
    return {"path": path, "size": size, "crc32c": crc, "node": node}


def manifest(step: int, shards: Sequence[dict[str, Any]], **metadata: Any) -> dict[str, Any]:
    return {"step": step, "shards": list(shards), "metadata": metadata}


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in COUNTED_TABLES
        }


def _checkpoint_id(conn: Any, job: str, step: int) -> int:
    cid: int = conn.execute(
        text(
            "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
            "WHERE j.name = :job AND c.step = :step"
        ),
        {"job": job, "step": step},
    ).scalar_one()
    return cid


def set_marker(
    engine: Engine,
    job: str,
    step: int,
    tier: str,
    state: str,
    *,
    reason: str | None = None,
    quarantine: str | None = None,
) -> None:
    with engine.begin() as conn:
        cid = _checkpoint_id(conn, job, step)
        conn.execute(
            text(
                "UPDATE checkpoint_tier SET state = :state, reason = :reason, "
                "quarantine_reason = :q, restorable_at = CASE "
                "WHEN CAST(:r AS boolean) "
                "THEN now() END WHERE checkpoint_id = :cid AND tier = :tier"
            ),
            {
                "state": state,
                "r": state == "restorable",
                "reason": reason,
                "q": quarantine,
                "cid": cid,
                "tier": tier,
            },
        )


def set_replicas(
    engine: Engine,
    job: str,
    step: int,
    tier: str,
    state: str,
    *,
    local: bool = False,
    paths: Sequence[str] | None = None,
) -> None:
    """One replica per shard (or per listed path) on `tier`; local replicas sit on the shard's
    node. Location is `/<tier>[/<node>]/<job>/<step>/<path>` or s3://bucket/... for s3."""
    with engine.begin() as conn:
        cid = _checkpoint_id(conn, job, step)
        shards = conn.execute(
            text("SELECT id, path, size, node_id FROM shard WHERE checkpoint_id = :cid"),
            {"cid": cid},
        ).all()
        for s in shards:
            if paths is not None and s.path not in paths:
                continue
            node = s.node_id if local else None
            where = f"/{tier}/{node}" if local else f"/{tier}"
            location = (
                f"s3://bucket/{job}/{step}/{s.path}"
                if tier == "s3"
                else f"{where}/{job}/{step}/{s.path}"
            )
            conn.execute(
                text(
                    "INSERT INTO replica (shard_id, checkpoint_id, tier, node_id, state, location, "
                    "bytes_done, verified_at) VALUES (:sid, :cid, :tier, :node, :state, :loc, "
                    ":done, CASE WHEN CAST(:v AS boolean) THEN now() END) "
                    "ON CONFLICT (shard_id, tier) DO UPDATE SET state = excluded.state, "
                    "bytes_done = excluded.bytes_done, verified_at = excluded.verified_at"
                ),
                {
                    "sid": s.id,
                    "cid": cid,
                    "tier": tier,
                    "node": node,
                    "state": state,
                    "v": state == "verified",
                    "loc": location,
                    "done": s.size if state == "verified" else s.size // 2,
                },
            )


def quarantine_checkpoint(engine: Engine, job: str, step: int, reason: str) -> None:
    with engine.begin() as conn:
        cid = _checkpoint_id(conn, job, step)
        conn.execute(
            text("UPDATE checkpoint SET quarantine_reason = :r WHERE id = :cid"),
            {"r": reason, "cid": cid},
        )


def restorable(engine: Engine, job: str, step: int, tier: str, *, local: bool = False) -> None:
    set_replicas(engine, job, step, tier, "verified", local=local)
    set_marker(engine, job, step, tier, "restorable")
