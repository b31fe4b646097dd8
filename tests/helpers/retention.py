"""Helpers of the retention end-to-end tests: a job with its own policy row, checkpoints written
to the nodes' local roots and run through their real lifecycle, and waiting for the job's retention
workflow to settle. Shard files and catalog rows are made by tests/workflows' helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import Seeded, random_shards, seed_checkpoint
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.engine import (
    async_sessions,
    make_async_engine,
)
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.models import Checkpoint, Job, Replica, RetentionPolicy, TierCopy
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.reads.views import LatestRestorableView
from tierpoint.catalog.tier_copy.machine import ensure_tier_copies
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.contract.retention import RetentionResult, retention_workflow_id
from tierpoint.retention.policy import Policy
from tierpoint.temporal import request_retention, start_lifecycle
from tierpoint.tier_config import TierKind

NODES = ("node-a", "node-b")
# Guards against a hang, not a performance assertion.
RESULT_TIMEOUT = 480.0


def create_job(sessions: sessionmaker[Session], job: str, spec: dict[str, Any]) -> int:
    """The job row with its own policy (validated first, as the API would)."""
    Policy.from_spec(spec)
    with sessions.begin() as s:
        policy_id = s.scalar(
            insert(RetentionPolicy)
            .values(name=f"policy-{job}", spec=spec)
            .returning(RetentionPolicy.id)
        )
        s.execute(
            pg_insert(Job)
            .values(name=job, policy_id=policy_id)
            .on_conflict_do_update(index_elements=["name"], set_={"policy_id": policy_id})
        )
        assert isinstance(policy_id, int)
        return policy_id


def set_policy(sessions: sessionmaker[Session], policy_id: int, spec: dict[str, Any]) -> None:
    Policy.from_spec(spec)
    with sessions.begin() as s:
        s.execute(
            update(RetentionPolicy)
            .where(RetentionPolicy.id == policy_id)
            .values(spec=spec, version=RetentionPolicy.version + 1)
        )


async def write_checkpoint(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    job: str,
    step: int,
    *,
    per_node: int = 2,
    size: int = 1024,
    nodes: Sequence[str] = NODES,
) -> tuple[Seeded, LifecycleResult]:
    """Shards on each of `nodes`, registered as the API does (including a `pending` marker for
    every configured tier), and the checkpoint's lifecycle run to its end."""
    seeded = seed_checkpoint(
        settings, sessions, job, step, random_shards(list(nodes), per_node, size)
    )
    with sessions.begin() as s:
        head = checkpoint_head(s, seeded.checkpoint_id)
        assert head is not None
        ensure_tier_copies(s, head, settings.tier_names())
    await start_lifecycle(
        client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step)
    )
    handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert isinstance(result, LifecycleResult)
    return seeded, result


async def settle(client: Client, job: str, *, request: bool = True) -> RetentionResult:
    """Run the job's retention to its end: ask for one more pass (which sees every promotion that
    finished before this call) and wait for the run, following continue-as-new."""
    if request:
        await request_retention(client, job, "test: settle")
    handle = client.get_workflow_handle(retention_workflow_id(job), result_type=RetentionResult)
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert isinstance(result, RetentionResult)
    return result


def markers(sessions: sessionmaker[Session], job: str) -> dict[tuple[int, str], str]:
    """(step, tier) -> marker state, for every marker of the job."""
    with sessions() as s:
        rows = s.execute(
            select(TierCopy.step, TierCopy.tier, TierCopy.state)
            .join(Job, Job.id == TierCopy.job_id)
            .where(Job.name == job)
        )
        return {(step, tier): state for step, tier, state in rows}


def replica_states(sessions: sessionmaker[Session], job: str) -> dict[tuple[int, str], set[str]]:
    """(step, tier) -> the set of replica states of that copy."""
    with sessions() as s:
        rows = s.execute(
            select(Checkpoint.step, Replica.tier, Replica.state)
            .join(Checkpoint, Checkpoint.id == Replica.checkpoint_id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job)
        )
        out: dict[tuple[int, str], set[str]] = {}
        for step, tier, state in rows:
            out.setdefault((step, tier), set()).add(state)
        return out


def steps_on_disk(root: Path, job: str) -> set[int]:
    """Steps with at least one file under <root>/<job>/<step>/."""
    base = root / job
    if not base.exists():
        return set()
    return {
        int(d.name) for d in base.iterdir() if d.is_dir() and any(p.is_file() for p in d.rglob("*"))
    }


def s3_keys(services: Services, settings: Settings, job: str) -> dict[int, set[str]]:
    """step -> relative shard paths stored in S3 for the job (list_objects_v2, all pages)."""
    tier = next(t for t in settings.tiers if t.kind is TierKind.S3)
    assert tier.bucket is not None
    prefix = f"{tier.prefix}{job}/"
    out: dict[int, set[str]] = {}
    pages = s3_client(services).get_paginator("list_objects_v2")
    for page in pages.paginate(Bucket=tier.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            step, _, path = obj["Key"][len(prefix) :].partition("/")
            out.setdefault(int(step), set()).add(path)
    return out


async def latest(
    settings: Settings, job: str, *, tier: str | None = None, node: str | None = None
) -> LatestRestorableView:
    """GET latest's answer, from the catalog query the API serves it with."""
    engine = make_async_engine(settings.database_url, pool_size=1)
    try:
        async with async_sessions(engine)() as session:
            return await session.run_sync(
                latest_restorable, job, settings.tiers, tier=tier, node=node
            )
    finally:
        await engine.dispose()


def utcnow(sessions: sessionmaker[Session]) -> datetime:
    """The catalog's clock (leases are compared with it)."""
    from sqlalchemy import func

    with sessions() as s:
        now = s.scalar(select(func.now()))
        assert isinstance(now, datetime)
        return now


async def wait_for(condition: Callable[[], bool], attempts: int = 2400) -> None:
    """Poll until `condition` holds (a guard against hangs, not a timing assertion)."""
    for _ in range(attempts):
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition never held")
