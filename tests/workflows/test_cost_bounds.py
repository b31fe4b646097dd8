"""What one checkpoint costs, measured on real lifecycles and held to the cost model
(tests/workflows/cost_model.py, the formulas of docs/architecture.md): Temporal history events and
activity tasks, catalog rows and catalog events, at 1, 4 (the demo), 1,000 and 5,000 shards on 2
nodes and 3 tiers. The shards are tiny: these costs grow with shards and batches, not bytes; one
case lowers `min_batch_bytes` to their size so that the nodes' shards split by bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import Counter
from dataclasses import dataclass

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from apps.worker import node_roots
from tests.helpers import cost_model
from tests.helpers.lifecycle import NODES, activities_run, crc_hex, new_job, running_workers
from tierpoint.catalog.checkpoint.registration import register_checkpoint
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.models import Checkpoint, Event, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import (
    COPY_BATCH,
    PLAN,
    PROMOTE,
    SEAL_BATCH,
    LifecycleInput,
    LifecycleResult,
    workflow_id,
)
from tierpoint.contract.retention import REQUEST, retention_workflow_id
from tierpoint.manifest import Manifest
from tierpoint.manifest import ShardSpec as ManifestShard
from tierpoint.temporal import start_lifecycle

# Guards against a hang, not a performance assertion.
RESULT_TIMEOUT = 900.0
SHARD_BYTES = 16
E = EventType


@dataclass(frozen=True)
class Registered:
    job: str
    step: int
    checkpoint_id: int


async def register(settings: Settings, sessions: sessionmaker[Session], shards: int) -> Registered:
    """Shard files on the nodes' local tier, registered through the product's registration (so
    the markers and the `registered` event are the product's own)."""
    local = settings.local_tier()
    assert local is not None
    job, step = new_job(), 1
    specs = []
    for node, count in zip(NODES, cost_model.spread(shards, len(NODES)), strict=True):
        for i in range(count):
            data = os.urandom(SHARD_BYTES)
            path = f"rank-{node}/shard-{i:05d}.bin"
            f = local.root_for(node) / job / str(step) / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
            specs.append(ManifestShard(path=path, size=len(data), crc32c=crc_hex(data), node=node))
    with sessions.begin() as s:
        for node in NODES:
            upsert_node(s, node, node_roots(settings, node))
    engine = make_async_engine(settings.database_url, pool_size=1)
    try:
        async with async_sessions(engine).begin() as s:
            reg = await s.run_sync(
                register_checkpoint,
                job,
                Manifest(step=step, shards=specs),
                [t.name for t in settings.tiers],
            )
    finally:
        await engine.dispose()
    assert reg.created
    return Registered(job, step, reg.checkpoint_id)


def catalog_rows(sessions: sessionmaker[Session], checkpoint_id: int) -> dict[str, int]:
    """The checkpoint's rows per table, and its events per kind (`event:<kind>`)."""
    with sessions() as s:
        counts = {
            table.__tablename__: s.scalar(
                select(func.count()).select_from(table).where(table.checkpoint_id == checkpoint_id)
            )
            or 0
            for table in (Shard, Replica, TierCopy, Event)
        }
        counts["checkpoint"] = (
            s.scalar(
                select(func.count()).select_from(Checkpoint).where(Checkpoint.id == checkpoint_id)
            )
            or 0
        )
        kinds = s.execute(
            select(Event.kind, func.count())
            .where(Event.checkpoint_id == checkpoint_id)
            .group_by(Event.kind)
        )
        counts.update({f"event:{k}": n for k, n in kinds})
    return counts


@pytest.mark.parametrize(
    ("shards", "min_batch_bytes"),
    [
        pytest.param(1, None, id="1-shard"),
        pytest.param(4, None, id="4-shards-as-the-demo"),
        # 8 shards of 16 bytes per node, ranges of at least 32 bytes: 4 batches per node.
        pytest.param(16, 2 * SHARD_BYTES, id="16-shards-split-by-bytes"),
        pytest.param(1_000, None, id="1000-shards"),
        # 5 batches per node, one more than a node's window (parallelism 4), so each node's
        # window refills; more shards add work per batch, not another shape of history.
        pytest.param(5_000, None, id="5000-shards", marks=pytest.mark.slow),
    ],
)
async def test_costs_of_one_checkpoint_match_the_cost_model(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    shards: int,
    min_batch_bytes: int | None,
) -> None:
    model = cost_model.Checkpoint(cost_model.spread(shards, len(NODES)), tiers=len(settings.tiers))
    # The model's defaults are the product's; a changed default must change the doc too.
    assert (model.shard_batch_size, model.max_batches_per_stage, model.min_batch_bytes) == (
        settings.shard_batch_size,
        settings.max_batches_per_stage,
        settings.min_batch_bytes,
    )
    assert {t.parallelism for t in settings.tiers} == {model.parallelism}
    assert model.shard_bytes == SHARD_BYTES
    if min_batch_bytes is not None:
        settings = settings.model_copy(update={"min_batch_bytes": min_batch_bytes})
        model = dataclasses.replace(model, min_batch_bytes=min_batch_bytes)

    reg = await register(settings, sessions, shards)
    job, step, cid = reg.job, reg.step, reg.checkpoint_id

    async with running_workers(settings, client):
        await start_lifecycle(client, LifecycleInput(checkpoint_id=cid, job=job, step=step))
        handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        # The promotions asked for retention runs; wait until they are done so that any catalog
        # event they write is counted.
        retention = client.get_workflow_handle(retention_workflow_id(job))
        await asyncio.wait_for(retention.result(), RESULT_TIMEOUT)
        history = await handle.fetch_history()

    assert [t.state for t in result.tiers] == ["restorable"] * model.tiers
    assert result.batches == model.batches

    # Temporal: every event of the history is accounted for by the model.
    by_type = Counter(e.event_type for e in history.events)
    tasks = by_type[E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    a, local = model.activities, model.local_activities
    assert dict(by_type) == {
        E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: 1,
        E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: tasks,
        E.EVENT_TYPE_WORKFLOW_TASK_STARTED: tasks,
        E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: tasks,
        E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: a,
        E.EVENT_TYPE_ACTIVITY_TASK_STARTED: a,
        E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: a,
        # The local activities' markers and two patch markers (local steps, the fan-out).
        E.EVENT_TYPE_MARKER_RECORDED: local + 2,
        E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: 2,
        E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: 1,
    }
    assert model.workflow_tasks_min <= tasks <= model.workflow_tasks_max
    n = len(history.events)
    assert n == model.history_events(tasks)
    assert model.history_events_min <= n <= model.history_events_max
    # The first workflow task (the plan ran inside it) schedules a window per node at once: with
    # byte-split batches more than one tier's parallelism across the two nodes.
    events = list(history.events)
    first_task = next(
        i for i, e in enumerate(events) if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    scheduled_first = 0
    for e in events[first_task + 1 :]:
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled_first += 1
        elif e.event_type not in (
            E.EVENT_TYPE_MARKER_RECORDED,
            E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        ):
            break
    assert scheduled_first == model.node_window
    queued, ran_locally = activities_run(history)
    b, t = model.batches, model.tiers
    assert queued == {SEAL_BATCH: b, COPY_BATCH: b * (t - 1)}
    assert ran_locally == {PLAN: 1, PROMOTE: t, REQUEST: t}

    # Catalog: the checkpoint's rows and events.
    rows = catalog_rows(sessions, cid)
    print(
        f"{shards} shards, b={b}: {n} history events ({tasks} workflow tasks; model "
        f"{model.history_events_min}..{model.history_events_max}), {a} activities + {local} "
        "local, "
        f"{rows['event']} catalog events, "
        f"{sum(rows[k] for k in ('checkpoint', 'shard', 'replica', 'checkpoint_tier', 'event'))}"
        " catalog rows"
    )
    assert {k: v for k, v in rows.items() if k.startswith("event:")} == {
        "event:registered": 1,
        "event:sealed": b,
        "event:copied": b * (t - 1),
        "event:verified": b * (t - 1),
        "event:promoted": t,
    }
    assert rows["event"] == model.catalog_events
    assert (rows["checkpoint"], rows["shard"], rows["replica"], rows["checkpoint_tier"]) == (
        1,
        model.shards,
        model.shards * t,
        t,
    )
    written = sum(rows[k] for k in ("checkpoint", "shard", "replica", "checkpoint_tier", "event"))
    assert written == model.catalog_rows
