"""Fixtures for the retention admin API: the API tests' app and catalog fixtures, a job whose
retention workflow is terminated afterwards, policy names cleaned up afterwards, and seeding of
checkpoints restorable on chosen tiers (rows set as the lifecycle workflow would)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from tests.api.conftest import catalog, client, manifest, nodes, restorable, shard, temporal
from tierpoint.contract.retention import retention_workflow_id

__all__ = ["catalog", "client", "nodes", "temporal"]

RETENTION_TABLES = ("job", "checkpoint", "retention_policy", "restore_lease", "event")
SHARD_BYTES = 100


@pytest.fixture
async def job(temporal: Client, catalog: Engine) -> AsyncIterator[str]:
    name = f"rjob-{uuid.uuid4().hex[:12]}"
    yield name
    for prefix in ("checkpoint/", "retention/"):
        async for wf in temporal.list_workflows(f"WorkflowId STARTS_WITH '{prefix}{name}'"):
            with contextlib.suppress(Exception):
                await temporal.get_workflow_handle(wf.id).terminate("test finished")
    with contextlib.suppress(Exception):
        await temporal.get_workflow_handle(retention_workflow_id(name)).terminate("test finished")
    with catalog.begin() as conn:
        conn.execute(text("DELETE FROM job WHERE name LIKE :prefix"), {"prefix": name + "%"})


@pytest.fixture
def policy_names(catalog: Engine) -> Iterator[list[str]]:
    """Names for policies a test creates; afterwards they are unassigned and deleted."""
    names: list[str] = []
    yield names
    with catalog.begin() as conn:
        for name in names:
            conn.execute(
                text(
                    "UPDATE job SET policy_id = NULL WHERE policy_id IN "
                    "(SELECT id FROM retention_policy WHERE name = :n)"
                ),
                {"n": name},
            )
            conn.execute(text("DELETE FROM retention_policy WHERE name = :n"), {"n": name})


@pytest.fixture
def new_policy(policy_names: list[str]) -> Iterator[Callable[[], str]]:
    def make() -> str:
        name = f"pol-{uuid.uuid4().hex[:10]}"
        policy_names.append(name)
        return name

    yield make


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
