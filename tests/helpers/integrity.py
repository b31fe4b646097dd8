"""Helpers of the integrity tests (scrub, repair, reconciliation, corrupt-copy reports): a
checkpoint promoted on every tier by a real lifecycle, bytes changed or removed behind
tierpoint's back, and what the catalog recorded about it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client

from tests.helpers.faults import OVERALL_TIMEOUT
from tests.helpers.lifecycle import (
    NODES,
    Seeded,
    ShardSpec,
    new_job,
    random_shards,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tierpoint.catalog.models import Event, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.integrity import (
    RECONCILE_WORKFLOW,
    SCRUB_WORKFLOW,
    ReconcileInput,
    ReconcileReport,
    RepairResult,
    ScrubInput,
    ScrubResult,
    repair_workflow_id,
)
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle


def integrity_settings(settings: Settings, **changes: Any) -> Settings:
    """Every verified replica due for a scrub at once; the local tier not scrubbed (so a run
    needs no node worker), unless `ssd_bandwidth` says otherwise."""
    ssd_bw = changes.pop("ssd_bandwidth", 0)
    tiers = [
        t.model_copy(update={"scrub_bandwidth": ssd_bw}) if t.name == "ssd" else t
        for t in settings.tiers
    ]
    return settings.model_copy(
        update={
            "tiers": tiers,
            "scrub_min_age": timedelta(0),
            "scrub_interval": timedelta(days=1),
            "reconcile_grace": timedelta(seconds=0),
            **changes,
        }
    )


async def promoted(
    cfg: Settings,
    client: Client,
    engine: Engine,
    per_node: int = 2,
    size: int = 64_000,
    *,
    workers: bool = True,
    shards: list[ShardSpec] | None = None,
) -> Seeded:
    """A checkpoint on both nodes (`per_node` shards of `size` bytes each, unless `shards` says
    otherwise), restorable on every tier of `cfg` after a real lifecycle, run on workers of its
    own (`workers=False`: on the caller's, already running)."""
    shards = shards or random_shards(NODES, per_node, size)
    seeded = seed_checkpoint(cfg, sessionmaker(engine), new_job(), 10, shards)
    async with contextlib.AsyncExitStack() as stack:
        if workers:
            await stack.enter_async_context(running_workers(cfg, client))
        await start_lifecycle(
            client,
            LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step),
        )
        handle = client.get_workflow_handle(
            workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
        )
        result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
    assert [(t.tier, t.state) for t in result.tiers] == [(t.name, "restorable") for t in cfg.tiers]
    return seeded


def s3_key(cfg: Settings, seeded: Seeded, sh: ShardSpec) -> str:
    return f"{cfg.tier('s3').prefix}{seeded.job}/{seeded.step}/{sh.path}"


def flip_s3(cfg: Settings, s3: Any, seeded: Seeded, sh: ShardSpec, at: int = 1000) -> None:
    """Rewrite the object with one bit changed, as bit rot or a stray writer would (S3 keeps
    whatever checksum, if any, the new PUT carries: only reading the bytes tells)."""
    key = s3_key(cfg, seeded, sh)
    data = bytearray(s3.get_object(Bucket=cfg.tier("s3").bucket, Key=key)["Body"].read())
    data[at] ^= 0x01
    s3.put_object(Bucket=cfg.tier("s3").bucket, Key=key, Body=bytes(data))


def flip_file(cfg: Settings, tier: str, seeded: Seeded, sh: ShardSpec, at: int = 1000) -> None:
    node = sh.node if cfg.tier(tier).kind.value == "local" else None
    f = shard_file(cfg, tier, node, seeded.job, seeded.step, sh.path)
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))


def events(
    engine: Engine, checkpoint_id: int, *kinds: str
) -> list[tuple[str, str | None, dict[str, Any]]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(Event.kind, Event.tier, Event.detail)
            .where(Event.checkpoint_id == checkpoint_id, Event.kind.in_(kinds))
            .order_by(Event.id)
        ).all()
    return [(k, t, d) for k, t, d in rows]


def replica_states(engine: Engine, checkpoint_id: int) -> dict[tuple[str, str], str]:
    """(tier, shard path) -> replica state."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Replica.tier, Shard.path, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id)
        ).all()
    return {(t, p): st for t, p, st in rows}


async def run_scrub(client: Client, wid: str) -> ScrubResult:
    handle = await client.start_workflow(
        SCRUB_WORKFLOW, ScrubInput(), id=wid, task_queue=SHARED_TASK_QUEUE, result_type=ScrubResult
    )
    return await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)


async def run_reconcile(client: Client, wid: str, inp: ReconcileInput) -> ReconcileReport:
    handle = await client.start_workflow(
        RECONCILE_WORKFLOW, inp, id=wid, task_queue=SHARED_TASK_QUEUE, result_type=ReconcileReport
    )
    return await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)


async def repair_result(client: Client, seeded: Seeded) -> RepairResult:
    handle = client.get_workflow_handle(
        repair_workflow_id(seeded.job, seeded.step), result_type=RepairResult
    )
    return await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
