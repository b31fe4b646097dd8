"""What one checkpoint costs the orchestration, whatever the lifecycle's shape: real lifecycles on
the dev stack (its API, workers, Temporal, Postgres and moto) for checkpoints of tiny shards on
its two nodes, counted from the services themselves:

- Temporal: every history event of the checkpoint's workflows (the lifecycle, the stage children
  it starts, found from its own history, recursively) and of the job's retention workflow, by
  the client's history fetch; activity tasks (`ActivityTaskScheduled`), local activities (their
  markers) and workflow tasks among them;
- the catalog: the checkpoint's rows (checkpoint, shards, replicas, tier markers, events) and
  its events, read from Postgres once the lifecycle has finished;
- the API: requests it served during the run (its `tierpoint_api_requests` counter, read from
  the API's own metrics listener, stack.json's `metrics_url`); the scenario waits on Temporal,
  not by polling the API, so what is counted is the job's registration and whatever else asked
  the API;
- the wall time from the registration request to the lifecycle's end (restorable everywhere).

Nothing here assumes a formula: the counts are printed per shard count, each with its ratio to
the 1-shard checkpoint, so whether they grow with batches or with shards is read off the table
(`batches` is the lifecycle's own report of its batches per stage).
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client as TemporalClient
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from tierpoint_client.models import ShardSpec

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.stack_ckpt import Stack
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Checkpoint, Event, Job, Replica, Shard, TierCopy
from tierpoint.contract.lifecycle import workflow_id
from tierpoint.contract.retention import retention_workflow_id

E = EventType
SHARD_BYTES = 16
WAIT = 3600.0  # hang guard: 100,000 shards through moto take minutes
LOCAL_ACTIVITY_MARKER = "core_local_activity"

# metric -> what the table calls it
COUNTS = {
    "history_events": "history events (all workflows)",
    "activity_tasks": "activity tasks",
    "local_activities": "local activities",
    "workflow_tasks": "workflow tasks",
    "workflows": "workflows (lifecycle + children)",
    "retention_events": "retention history events",
    "catalog_rows": "catalog rows written",
    "catalog_events": "catalog events",
    "api_requests": "API requests",
    "batches": "batches per stage",
}


def stack_env(data_dir: Path) -> dict[str, str]:
    """DIR/stack.env's variables (a file of `export K=V`, values shell-quoted)."""
    found: dict[str, str] = {}
    for line in (data_dir / "stack.env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            found[key] = shlex.split(value)[0] if value else ""
    return found


def history_counts(histories: Sequence[Any]) -> dict[str, int]:
    """Events of the given workflow histories, by what they cost."""
    by_type: Counter[int] = Counter()
    local = 0
    for h in histories:
        for e in h.events:
            by_type[e.event_type] += 1
            if (
                e.event_type == E.EVENT_TYPE_MARKER_RECORDED
                and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
            ):
                local += 1
    return {
        "history_events": sum(by_type.values()),
        "activity_tasks": by_type[E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED],
        "local_activities": local,
        "workflow_tasks": by_type[E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED],
        "workflows": len(histories),
    }


def api_requests(metrics_url: str | None) -> float:
    """Requests the API has served since it started (its metrics listener, stack.json's
    `metrics_url`)."""
    if metrics_url is None:
        raise RuntimeError("the dev stack's facts name no metrics_url: restart it")
    with urllib.request.urlopen(metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "tierpoint_api_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                total += sample.value
    return total


def catalog_counts(engine: Engine, job: str, step: int) -> dict[str, int]:
    with engine.connect() as c:
        cid = c.scalar(
            select(Checkpoint.id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
        if cid is None:
            raise RuntimeError(f"{job}/{step} is not in the catalog")
        rows = 1
        for table in (Shard, Replica, TierCopy, Event):
            rows += (
                c.scalar(select(func.count()).select_from(table).where(table.checkpoint_id == cid))
                or 0
            )
        events = c.scalar(select(func.count()).select_from(Event).where(Event.checkpoint_id == cid))
    return {"catalog_rows": rows, "catalog_events": events or 0}


class Orchestration(Scenario):
    name = "orchestration"
    summary = "orchestration cost of one checkpoint: Temporal, catalog and API work per shard count"

    def __init__(self, env: Env, shard_counts: Sequence[int]) -> None:
        self.env, self.counts = env, list(shard_counts)
        self.stack: Stack | None = None
        self.loop = asyncio.new_event_loop()
        self.pending: dict[int, tuple[str, list[ShardSpec]]] = {}
        self.jobs: list[str] = []

    def params(self) -> dict[str, Any]:
        nodes = len(self.stack.nodes) if self.stack is not None else 2
        return {"shards": self.counts, "shard_bytes": SHARD_BYTES, "nodes": nodes}

    def watched(self) -> Watched:
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = Stack(self.env)
        env = stack_env(self.stack.process.data_dir)
        self.engine = make_sync_engine(env["TIERPOINT_DATABASE_URL"], pool_size=1)
        self.temporal = self.loop.run_until_complete(
            TemporalClient.connect(
                env["TIERPOINT_TEMPORAL_ADDRESS"],
                namespace=env.get("TIERPOINT_TEMPORAL_NAMESPACE", "default"),
                data_converter=pydantic_data_converter,
            )
        )
        first = self.counts[0]
        methods = []
        for n in self.counts:
            label = f"{n:,} shards"
            rows = [Row(f"{label}: wall to restorable", "seconds", None)]
            rows += [
                Row(
                    f"{label}: {what}",
                    metric,
                    f"{first:,} shards: {what}" if n != first else None,
                    unit="n",
                )
                for metric, what in COUNTS.items()
            ]
            methods.append(
                Method(
                    label,
                    functools.partial(self._run, n),
                    tuple(rows),
                    before=functools.partial(self._write, n),
                    after=self._forget,
                )
            )
        return methods

    def _write(self, shards: int) -> None:
        """A new job's step 1: tiny shard files on the nodes' local tier, spread evenly."""
        assert self.stack is not None
        job = f"orch-{shards}-{uuid.uuid4().hex[:6]}"
        self.jobs.append(job)
        nodes = self.stack.nodes
        specs = []
        for i in range(shards):
            node = nodes[i % len(nodes)]
            path = f"{node}/shard-{i:06d}.bin"
            data = i.to_bytes(SHARD_BYTES, "little")
            f = self.stack.local_dir(node, job, 1) / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
            specs.append(ShardSpec(path, SHARD_BYTES, f"{crc32c.crc32c(data):08x}", node))
        self.pending[shards] = (job, specs)

    def _run(self, shards: int) -> Outcome:
        assert self.stack is not None
        job, specs = self.pending.pop(shards)
        api_before = api_requests(self.stack.info.metrics_url)
        t0 = time.perf_counter()
        self.stack.register(job, 1, specs)
        result = self.loop.run_until_complete(self._finished(job))
        seconds = time.perf_counter() - t0
        histories, retention = self.loop.run_until_complete(
            lifecycle_histories(self.temporal, job, 1)
        )
        metrics: dict[str, float] = {"seconds": seconds}
        metrics.update(history_counts(histories))
        metrics["retention_events"] = sum(len(h.events) for h in retention)
        metrics.update(catalog_counts(self.engine, job, 1))
        metrics["api_requests"] = api_requests(self.stack.info.metrics_url) - api_before
        metrics["batches"] = float(result.get("batches", 0)) if isinstance(result, dict) else 0.0
        return Outcome(metrics)

    async def _finished(self, job: str) -> Any:
        """The lifecycle's result, then the end of the retention run its promotions asked for
        (whose catalog events count too)."""
        result = await asyncio.wait_for(self._result(workflow_id(job, 1)), WAIT)
        await asyncio.wait_for(self._result(retention_workflow_id(job)), WAIT)
        return result

    async def _result(self, wid: str) -> Any:
        # The API may start the lifecycle after it has answered the registration: until then
        # Temporal knows no such workflow.
        while True:
            try:
                return await self.temporal.get_workflow_handle(wid).result()
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise
            await asyncio.sleep(0.05)

    def _forget(self) -> None:
        assert self.stack is not None
        if self.jobs:
            self.stack.forget(self.jobs[-1])

    def close(self) -> None:
        if self.stack is not None:
            for job in self.jobs:
                self.stack.forget(job)
        if hasattr(self, "engine"):
            self.engine.dispose()
        self.loop.close()


async def lifecycle_histories(
    temporal: TemporalClient, job: str, step: int
) -> tuple[list[Any], list[Any]]:
    """A checkpoint's lifecycle history and its children's (recursively), and its job's
    retention run's."""
    found: list[Any] = []
    todo = [workflow_id(job, step)]
    while todo:
        history = await temporal.get_workflow_handle(todo.pop()).fetch_history()
        found.append(history)
        todo += [
            e.start_child_workflow_execution_initiated_event_attributes.workflow_id
            for e in history.events
            if e.event_type == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ]
    retention = await temporal.get_workflow_handle(retention_workflow_id(job)).fetch_history()
    return found, [retention]
