"""Helpers of tests that drive the API: manifests and shards as a job sends them, the app over
httpx's ASGI transport, and catalog rows set directly as the lifecycle workflow would (markers,
replicas, quarantine), to put a checkpoint in a chosen state without running copies."""

from __future__ import annotations

import asyncio
import urllib.request
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import Engine, text
from temporalio.client import Client

from tests.helpers.tokens import app_admin_token, bearer
from tierpoint.contract.lifecycle import workflow_id

NODE_A, NODE_B = "node-a", "node-b"


COUNTED_TABLES = ("job", "checkpoint", "shard", "checkpoint_tier", "replica", "event")
# The port of each running client's app's /metrics listener.
_METRICS_PORTS: weakref.WeakKeyDictionary[httpx.AsyncClient, int] = weakref.WeakKeyDictionary()


async def running_client(
    app: FastAPI, *, authenticated: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    """The started app; its requests carry a fresh admin token of the app's catalog unless
    `authenticated` is false (tests of authentication itself)."""
    async with app.router.lifespan_context(app):
        headers = bearer(await app_admin_token(app)) if authenticated else {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://tierpoint", headers=headers
        ) as client:
            port = getattr(app.state, "metrics_port", None)
            if port is not None:
                _METRICS_PORTS[client] = port
            yield client


async def scrape_api(client: httpx.AsyncClient) -> str:
    """The exposition of the client's app, as Prometheus scrapes it: over HTTP from the app's
    own metrics listener (the settings' `api_metrics_port`), not through the API."""
    port = _METRICS_PORTS[client]

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body: bytes = r.read()
            return body.decode()

    return await asyncio.to_thread(get)


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
            "WHERE j.name = :job AND c.step = :step "
            # the step as the job's timeline sees it (docs/api.md, "A run's timeline")
            "ORDER BY c.superseded_by IS NOT NULL, c.branch DESC LIMIT 1"
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


RETENTION_TABLES = ("job", "checkpoint", "retention_policy", "restore_lease", "event")


SHARD_BYTES = 100


def row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in RETENTION_TABLES
        }


async def seed(
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    steps: Sequence[int],
    tiers: Sequence[str] = ("ssd", "lustre", "s3"),
) -> None:
    """Register each step (two shards on node-a) and make it restorable on `tiers`."""
    for step in steps:
        shards = [shard(f"s{step}/0", size=SHARD_BYTES), shard(f"s{step}/1", size=SHARD_BYTES)]
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(step, shards))
        assert r.status_code == 201, r.text
        for tier in tiers:
            restorable(catalog, job, step, tier, local=tier == "ssd")


def events(engine: Engine, kind: str, *, job: str | None = None) -> list[dict[str, Any]]:
    q = "SELECT e.actor, e.detail, e.checkpoint_id, j.name AS job FROM event e "
    q += "LEFT JOIN job j ON j.id = e.job_id WHERE e.kind = :kind"
    params: dict[str, object] = {"kind": kind}
    if job is not None:
        q += " AND j.name = :job"
        params["job"] = job
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(q + " ORDER BY e.id"), params)]
