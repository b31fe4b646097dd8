"""Helpers of the lifecycle tests: real shard files on the node roots, checkpoints inserted in the
catalog as the API would register them, real workers running in the background, and a lifecycle
run to its end with what it left (tier copies, bytes on every tier)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import crc32c
from sqlalchemy import func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from apps.worker import node_roots, run_workers
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.models import Checkpoint, Job, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle
from tierpoint.tier_config import TierKind

NODES = ("node-a", "node-b")


@dataclass(frozen=True)
class ShardSpec:
    node: str
    path: str
    data: bytes
    # What the job registers: None lets the seal stage compute it.
    crc32c: str | None


@dataclass(frozen=True)
class Seeded:
    checkpoint_id: int
    job: str
    step: int
    shards: list[ShardSpec]


def crc_hex(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def random_shards(nodes: Sequence[str], per_node: int, size: int) -> list[ShardSpec]:
    out = []
    for node in nodes:
        for i in range(per_node):
            data = os.urandom(size)
            out.append(ShardSpec(node, f"rank-{node}/shard-{i:05d}.bin", data, crc_hex(data)))
    return out


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def seed_checkpoint(
    settings: Settings,
    sessions: sessionmaker[Session],
    job: str,
    step: int,
    shards: Sequence[ShardSpec],
    *,
    started: bool = True,
) -> Seeded:
    """Write the shard files on their nodes' local tier and register the checkpoint as the API
    would (job, checkpoint with manifest digest, shards). `started=False` leaves it to the
    reconciler."""
    local = settings.local_tier()
    assert local is not None
    for sh in shards:
        f = local.root_for(sh.node) / job / str(step) / sh.path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(sh.data)
    manifest = [
        {"path": s.path, "size": len(s.data), "crc32c": s.crc32c, "node": s.node} for s in shards
    ]
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    with sessions.begin() as s:
        for node in sorted({sh.node for sh in shards}):
            upsert_node(s, node, node_roots(settings, node))
        s.execute(pg_insert(Job).values(name=job).on_conflict_do_nothing(index_elements=["name"]))
        job_id = s.scalar(select(Job.id).where(Job.name == job))
        cp_id = s.scalar(
            insert(Checkpoint)
            .values(
                job_id=job_id,
                step=step,
                total_bytes=sum(len(x.data) for x in shards),
                shard_count=len(shards),
                manifest_digest=digest,
                workflow_started_at=func.now() if started else None,
            )
            .returning(Checkpoint.id)
        )
        assert cp_id is not None
        s.execute(
            insert(Shard),
            [
                {
                    "checkpoint_id": cp_id,
                    "ordinal": i,
                    "path": sh.path,
                    "size": len(sh.data),
                    "checksum": sh.crc32c,
                    "node_id": sh.node,
                }
                for i, sh in enumerate(shards)
            ],
        )
    return Seeded(cp_id, job, step, list(shards))


@asynccontextmanager
async def running_workers(
    settings: Settings,
    client: Client,
    nodes: Sequence[str] = NODES,
    shared: bool = True,
    graceful_shutdown: timedelta = timedelta(seconds=5),
    metrics_port: int | None = None,
) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_workers(
            settings,
            client,
            nodes=nodes,
            shared=shared,
            stop=stop,
            graceful_shutdown=graceful_shutdown,
            metrics_port=metrics_port,
        )
    )
    try:
        yield stop
    finally:
        stop.set()
        await task


def shard_file(
    settings: Settings, tier: str, node: str | None, job: str, step: int, path: str
) -> Path:
    cfg = settings.tier(tier)
    assert cfg.kind is not TierKind.S3
    return cfg.root_for(node) / job / str(step) / path


# Histories replayed by tests/workflows/test_replay.py.
HISTORIES = Path(__file__).parents[1] / "workflows" / "histories"


def recording_histories() -> bool:
    return bool(os.environ.get("TIERPOINT_RECORD_HISTORY"))


async def record_history(
    client: Client,
    workflow_id: str,
    name: str,
    run_id: str | None = None,
    folder: Path = HISTORIES,
) -> Path:
    """Save a workflow's history (latest run, or `run_id`'s) with the id it ran under (replay
    compares child workflow ids derived from it). Never over a committed one: every recorded
    history must keep replaying, so a new recording of a scenario goes beside the old, as
    `name@LABEL.json` with the label from TIERPOINT_RECORD_HISTORY (if not 1) or today's date.
    `folder`: the project's workflows' histories, which test_replay replays, unless a test's own
    workflow ran it (that test replays it)."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    path = folder / f"{name}.json"
    if path.exists():
        label = os.environ.get("TIERPOINT_RECORD_HISTORY", "1")
        path = folder / f"{name}@{label if label != '1' else date.today().isoformat()}.json"
    path.write_text(
        json.dumps({"workflow_id": workflow_id, **json.loads(history.to_json())}, indent=1)
    )
    return path


LOCAL_ACTIVITY_MARKER = "core_local_activity"


def activities_run(history: WorkflowHistory) -> tuple[Counter[str], Counter[str]]:
    """The activity types a history ran: (through task queues, as local activities). A local
    activity leaves only a marker, whose `data` detail names its type."""
    queued: Counter[str] = Counter()
    local: Counter[str] = Counter()
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            queued[e.activity_task_scheduled_event_attributes.activity_type.name] += 1
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == LOCAL_ACTIVITY_MARKER:
                data = json.loads(marker.details["data"].payloads[0].data)
                local[data["activity_type"]] += 1
    return queued, local


# Guards against a hang, not a performance assertion.
RESULT_TIMEOUT = 480.0


async def run_lifecycle(
    client: Client, seeded: Seeded
) -> tuple[LifecycleResult, WorkflowHandle[Any, Any]]:
    await start_lifecycle(
        client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step)
    )
    handle = client.get_workflow_handle(
        workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
    )
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert isinstance(result, LifecycleResult)
    return result, handle


def markers(
    sessions: sessionmaker[Session], checkpoint_id: int
) -> dict[str, tuple[str, str | None]]:
    with sessions() as s:
        rows = s.execute(
            select(TierCopy.tier, TierCopy.state, TierCopy.reason).where(
                TierCopy.checkpoint_id == checkpoint_id
            )
        )
        return {t: (st, r) for t, st, r in rows}


def assert_bytes_everywhere(settings: Settings, services: Services, seeded: Seeded) -> None:
    s3 = s3_client(services)
    s3_tier = settings.tier("s3")
    for sh in seeded.shards:
        for tier, node in (("ssd", sh.node), ("lustre", None)):
            f = shard_file(settings, tier, node, seeded.job, seeded.step, sh.path)
            assert f.read_bytes() == sh.data, f"{tier}: {sh.path}"
        key = f"{s3_tier.prefix}{seeded.job}/{seeded.step}/{sh.path}"
        body = s3.get_object(Bucket=s3_tier.bucket, Key=key)["Body"].read()
        assert body == sh.data, f"s3: {sh.path}"
