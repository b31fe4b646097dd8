"""A job of many nodes rehearsed on one machine: N simulated nodes (10, 100, 1,000), each with its
own task queue and local root, served by a few node worker processes that each serve up to 250
nodes' queues (benchmarks/fleet.py), a shared worker, the API, Temporal, Postgres and moto, every
one a real process. Per run, one checkpoint of 8 shards of 16 KiB per node is registered as one
manifest and followed until the lifecycle and the retention run it asked for have finished; then
the next checkpoint, the same way. The first meets task queues that are new to Temporal (only its
times are reported, as `first checkpoint`); every other figure is the second's.

Counted per N, as totals and per node (each per-node row compared to the smallest N's: a ratio
above 1 is a cost that grows faster than the nodes):
- the time from registration to restorable on each tier (the catalog's `restorable_at` minus the
  checkpoint's `created_at`, one clock);
- Temporal: history events, activity tasks and workflow tasks of the checkpoint's workflows, and
  the history events of the retention run it asked for (benchmarks/scenarios/orchestration.py
  counts them the same way);
- the catalog's rows for the checkpoint; API requests (its own counter);
- CPU seconds of Temporal, Postgres (with its backends), the API, the node workers, the shared
  worker (on the dev stack: the stack's own process) and moto during the run, and the node
  workers' peak RSS;
- the paper model's figures for the same shape (tests/helpers/cost_model.py), each measured
  total compared to them;
- the CPU each process spends while the fleet is idle (every node worker polling its queue, no
  checkpoint in flight), per node and hour: what a node costs whether or not it is saving;
- a restart storm: the job's 8 ranks per node all asking for the checkpoint at once
  (benchmarks/restart_storm.py), in the reader's call pattern from before only the coordinator
  talked to the API (the baseline) and in today's.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import crc32c
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType as E
from temporalio.api.enums.v1 import TimeoutType
from temporalio.client import Client as TemporalClient
from temporalio.contrib.pydantic import pydantic_data_converter
from tierpoint_client.models import ShardSpec

from benchmarks import pg_statements
from benchmarks.env import Env
from benchmarks.fleet import JOB_PREFIX, Fleet
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched, error_text
from benchmarks.procs import cpu_seconds
from benchmarks.restart_storm import PATTERNS, storm
from benchmarks.scenarios.memory import reset_peak, status_kib
from benchmarks.scenarios.orchestration import (
    api_requests,
    catalog_counts,
    history_counts,
    lifecycle_histories,
)
from benchmarks.scenarios.register_latency import percentile
from tests.helpers.cost_model import Checkpoint as Model
from tierpoint.catalog.models import Checkpoint, Job, TierCopy
from tierpoint.contract.lifecycle import workflow_id
from tierpoint.contract.retention import retention_workflow_id

SHARDS_PER_NODE = 8
SHARD_BYTES = 16 * 1024
TIERS = ("ssd", "lustre", "s3")
WAIT = 3600.0  # hang guard
# Seconds the fleet is watched idle before the first checkpoint.
IDLE = 30.0
NODE_WORKERS = "node workers"
# metric -> label, for the counts reported as totals and per node
COUNTS = {
    "history_events": "history events",
    "activity_tasks": "activity tasks",
    "workflow_tasks": "workflow tasks",
    "retention_events": "retention history events",
    "catalog_rows": "catalog rows",
    "api_requests": "API requests",
}


# The first checkpoint meets task queues Temporal has not seen yet; the second is what every
# checkpoint after it costs, and what is counted.
STEPS = (1, 2)
# One rank per shard file, as DCP writes them: 8 ranks per node.
RANKS_PER_NODE = SHARDS_PER_NODE
# (what, metric of benchmarks.restart_storm.storm, unit)
STORM = (
    ("every rank ready", "ready", "s"),
    ("leases released", "done", "s"),
    ("API requests", "requests", "n"),
    ("requests failed after retries", "failed", "n"),
    ("API p50", "p50", "ms"),
    ("API p99", "p99", "ms"),
    ("API CPU", "cpu api", "s"),
    ("Postgres CPU", "cpu postgres", "s"),
)


def failure_cause(failure: Any) -> str:
    """A failure's kind and the first line of its message (a timeout names its type)."""
    if failure.HasField("timeout_failure_info"):
        kind = TimeoutType.Name(failure.timeout_failure_info.timeout_type)
        return f"{kind.removeprefix('TIMEOUT_TYPE_').lower()} timeout"
    return failure.message.splitlines()[0][:120] if failure.message else "unknown"


def activity_waits(histories: Sequence[Any]) -> dict[str, float]:
    """Seconds from each of the checkpoint's activity tasks' scheduled event to its started
    event. The started event is the last attempt's, so a retried task counts its failed attempts
    too: time no process's CPU shows. Also how many tasks ran more than once, and their failed
    attempts (the attempt number of each started event)."""
    scheduled: dict[tuple[int, int], tuple[float, str]] = {}
    found: list[tuple[float, str]] = []
    failed_attempts = 0
    causes: Counter[str] = Counter()  # a retried task's attempt before its last: why it failed
    for i, h in enumerate(histories):
        for e in h.events:
            if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                a = e.activity_task_scheduled_event_attributes
                what = f"{a.activity_type.name} on {a.task_queue.name}"
                scheduled[i, e.event_id] = (e.event_time.ToDatetime().timestamp(), what)
            elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started = e.activity_task_started_event_attributes
                at, what = scheduled[i, started.scheduled_event_id]
                found.append((e.event_time.ToDatetime().timestamp() - at, what))
                if started.attempt > 1:
                    causes[failure_cause(started.last_failure)] += 1
                    failed_attempts += started.attempt - 1
    if not found:
        return {}
    found.sort()
    slowest = ", ".join(f"{what} {wait:.1f} s" for wait, what in found[-5:][::-1])
    # Which tasks waited longest: what a fix has to look at first.
    print(f"activity tasks that waited longest: {slowest}", file=sys.stderr)
    if causes:
        why = "; ".join(f"{n}x {cause}" for cause, n in causes.most_common(5))
        print(f"why retried tasks failed before: {why}", file=sys.stderr)
    waits = [wait for wait, _ in found]
    return {
        "activity wait p50": percentile(waits, 0.5),
        "activity wait p99": percentile(waits, 0.99),
        "activity wait max": waits[-1],
        "activity tasks retried": causes.total(),
        "activity attempts failed": failed_attempts,
    }


def model_figures(nodes: int) -> dict[str, float]:
    """The paper model's figures for the shape. Its formulas cover stages without child
    workflows; above that (more than 250 nodes here) the activities and rows are the same, and
    the history bound `6·A + L + 7` leaves out the children's own few events each."""
    m = Model((SHARDS_PER_NODE,) * nodes, shard_bytes=SHARD_BYTES)
    activities = m.tiers * m.batches
    return {
        "model history_events": 6 * activities + m.local_activities + 7,
        "model activity_tasks": activities,
        "model catalog_rows": m.catalog_rows,
    }


class Scale(Scenario):
    name = "scale"
    summary = "one checkpoint of 8 x 16 KiB shards per node at N simulated nodes: cost per node"

    def __init__(
        self, env: Env, sizes: Sequence[int], *, own_services: bool = True, idle: float = IDLE
    ) -> None:
        self.env, self.sizes, self.own_services = env, list(sizes), own_services
        self.idle = idle
        self.fleet = Fleet(env.work / self.name, keep=env.keep)
        self.loop = asyncio.new_event_loop()
        self.pending: dict[int, tuple[str, list[ShardSpec]]] = {}
        self.storm_runs = 0

    def params(self) -> dict[str, Any]:
        return {"nodes": self.sizes, "shards_per_node": SHARDS_PER_NODE, "shard_bytes": SHARD_BYTES}

    def watched(self) -> Watched:
        return self.fleet.watched()

    def prepare(self) -> list[Method]:
        if self.own_services:
            self.fleet.start(max_nodes=max(self.sizes))
        else:
            self.fleet.attach(self.env.stack())
        # Each process's CPU, the node worker processes of a size counted together.
        self.cpu_labels = sorted({*self.fleet.watched(), NODE_WORKERS})
        self.temporal = self.loop.run_until_complete(
            TemporalClient.connect(
                self.fleet.temporal_address, data_converter=pydantic_data_converter
            )
        )
        return [
            Method(
                f"{n:,} nodes",
                functools.partial(self._run, n),
                self._rows(n),
                before=functools.partial(self._before, n),
                after=self.fleet.stop_nodes,
            )
            for n in self.sizes
        ]

    def _rows(self, n: int) -> tuple[Row, ...]:
        first, label = self.sizes[0], f"{n:,} nodes"
        per = f"{first:,} nodes" if n != first else None

        def per_node(what: str, metric: str, unit: str) -> Row:
            base = f"{per}: {what} per node" if per else None
            return Row(f"{label}: {what} per node", f"{metric}/node", base, unit=unit)

        rows = [
            Row(f"{label}: first checkpoint, restorable on {t}", f"first restorable {t}")
            for t in TIERS
        ]
        rows += [Row(f"{label}: restorable on {t}", f"restorable {t}") for t in TIERS]
        rows.append(per_node("wall to restorable on s3", "restorable s3", "s"))
        for metric, what in COUNTS.items():
            model = metric in ("history_events", "activity_tasks", "catalog_rows")
            base = f"{label}: {what} (model)" if model else None
            if model:
                rows.append(Row(f"{label}: {what} (model)", f"model {metric}", unit="n"))
            rows.append(Row(f"{label}: {what}", metric, base, unit="n"))
            rows.append(per_node(what, metric, "n"))
        for p in self.cpu_labels:
            rows.append(Row(f"{label}: CPU {p}", f"cpu {p}"))
            rows.append(per_node(f"CPU {p}", f"cpu {p}", "s"))
        for p in self.cpu_labels:
            base = f"{per}: idle CPU {p} per node-hour" if per else None
            rows.append(Row(f"{label}: idle CPU {p} per node-hour", f"idle {p}", base))
        for q in ("p50", "p99", "max"):
            what = f"activity tasks' wait for a worker, {q}"
            rows.append(Row(f"{label}: {what}", f"activity wait {q}", unit="s"))
        rows.append(
            Row(f"{label}: activity tasks run more than once", "activity tasks retried", unit="n")
        )
        rows.append(
            Row(f"{label}: activity attempts that failed", "activity attempts failed", unit="n")
        )
        rows.append(Row(f"{label}: node worker peak RSS (largest process)", "rss", unit="MiB"))
        rows.append(per_node("node worker RSS", "rss total", "MiB"))
        return tuple(rows + self._storm_rows(n))

    def _storm_rows(self, n: int) -> list[Row]:
        """The restart storm's rows: the coordinator-only pattern compared to the per-rank one."""
        label = f"{n:,} nodes: restart storm of {RANKS_PER_NODE * n:,} ranks"
        rows = []
        for what, metric, unit in STORM:
            before = f"{label}, {what}: per-rank (before)"
            rows.append(Row(before, f"storm per-rank {metric}", unit=unit))
            after = f"{label}, {what}: coordinator only (after)"
            rows.append(Row(after, f"storm coordinator {metric}", before, unit=unit))
        return rows

    def nodes(self, n: int) -> list[str]:
        return [f"n{n}-{i:04d}" for i in range(n)]

    def _before(self, n: int) -> None:
        """Untimed: the fleet's workers (every node reported in) and the shards on each node."""
        nodes = self.nodes(n)
        self.fleet.start_nodes(nodes)
        job = f"{JOB_PREFIX}{n}-{uuid.uuid4().hex[:6]}"
        specs = []
        for node in nodes:
            for i in range(SHARDS_PER_NODE):
                path = f"{node}/shard-{i}.bin"
                data = (node.encode() + bytes([i])) * (SHARD_BYTES // (len(node) + 1) + 1)
                data = data[:SHARD_BYTES]
                for step in STEPS:
                    f = self.fleet.local_dir(node, job, step) / path
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_bytes(data)
                specs.append(ShardSpec(path, SHARD_BYTES, f"{crc32c.crc32c(data):08x}", node))
        self.pending[n] = (job, specs)

    def _cpu(self) -> dict[str, float]:
        found: dict[str, float] = dict.fromkeys(self.cpu_labels, 0.0)
        for label, (pid, tree) in self.fleet.watched().items():
            key = NODE_WORKERS if label.startswith(NODE_WORKERS) else label
            found[key] += cpu_seconds(pid, tree=tree)
        return found

    def _run(self, n: int) -> Outcome:
        """The first checkpoint on the fleet's fresh queues (its times only), then the next one,
        which every count, CPU and the storm are of."""
        job, specs = self.pending.pop(n)
        first, step = STEPS
        idle = self._idle(n)
        self.fleet.client.register_manifest(job, first, specs)
        self.loop.run_until_complete(self._finished(job, first))
        metrics = {f"first {k}": v for k, v in self._restorable(job, first).items()}
        metrics.update(idle)
        workers = [p.pid for k, p in self.fleet.node_procs.items()]
        reset = all(reset_peak(pid) for pid in workers)
        api_before = api_requests(self.fleet.metrics_url)
        statements = pg_statements.out_dir() is not None and self.own_services
        if statements:
            pg_statements.reset(self.fleet.engine)
        cpu_before = self._cpu()
        self.fleet.client.register_manifest(job, step, specs)
        self.loop.run_until_complete(self._finished(job, step))
        cpu = {k: v - cpu_before[k] for k, v in self._cpu().items()}
        if statements:
            pg_statements.dump(self.fleet.engine, str(n))
        metrics.update({f"cpu {k}": v for k, v in cpu.items()})
        metrics["api_requests"] = api_requests(self.fleet.metrics_url) - api_before
        metrics.update(self._restorable(job, step))
        histories, retention = self.loop.run_until_complete(
            lifecycle_histories(self.temporal, job, step)
        )
        metrics.update(history_counts(histories))
        metrics.update(activity_waits(histories))
        metrics["retention_events"] = sum(len(h.events) for h in retention)
        metrics.update(catalog_counts(self.fleet.engine, job, step))
        rss = [status_kib(pid, "VmHWM" if reset else "VmRSS") / 1024 for pid in workers]
        metrics["rss"], metrics["rss total"] = max(rss), sum(rss)
        metrics.update(model_figures(n))
        for key in [k for k in metrics if not k.startswith("model ")]:
            metrics[f"{key}/node"] = metrics[key] / n
        storms, failed = self._storms(job, n, statements)
        metrics.update(storms)
        return Outcome(metrics, failed=failed)

    def _idle(self, n: int) -> dict[str, float]:
        """Each process's CPU over `self.idle` seconds with every node polling and nothing in
        flight, in seconds per node and hour."""
        before, start = self._cpu(), time.monotonic()
        time.sleep(self.idle)
        after, seconds = self._cpu(), time.monotonic() - start
        return {f"idle {k}": (after[k] - before[k]) * 3600 / n / seconds for k in before}

    def _storms(
        self, job: str, n: int, statements: bool
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Both patterns of the restart storm on the checkpoint just made restorable, in an order
        that alternates from run to run; the API's and Postgres' CPU of each. A pattern that
        fails is that pattern's failure (its rows), not the run's: the checkpoint's costs and the
        other pattern keep their numbers."""
        self.storm_runs += 1
        order = PATTERNS if self.storm_runs % 2 else PATTERNS[::-1]
        found: dict[str, float] = {}
        failed: dict[str, str] = {}
        for pattern in order:
            if statements:
                pg_statements.reset(self.fleet.engine)
            before = self._cpu()
            try:
                result, causes = storm(
                    self.fleet.new_client, job, RANKS_PER_NODE * n, self.nodes(n)[0], pattern
                )
            except Exception as exc:
                failed[f"storm {pattern} "] = error_text(exc)
                continue
            after = self._cpu()
            if statements:
                pg_statements.dump(self.fleet.engine, f"{n}-storm-{pattern}")
            if causes:
                # Beside the row that counts them: what a fix has to look at first.
                print(f"storm {pattern}: failed requests by cause: {dict(causes)}", file=sys.stderr)
            result["cpu api"] = after[self.fleet.api_label] - before[self.fleet.api_label]
            result["cpu postgres"] = after["postgres"] - before["postgres"]
            found.update({f"storm {pattern} {k}": v for k, v in result.items()})
        return found, failed

    def _restorable(self, job: str, step: int) -> dict[str, float]:
        """Seconds from the checkpoint's registration to restorable on each tier (the catalog's
        own clock for both)."""
        with self.fleet.engine.connect() as c:
            rows = c.execute(
                select(TierCopy.tier, TierCopy.restorable_at, Checkpoint.created_at)
                .join(Checkpoint, Checkpoint.id == TierCopy.checkpoint_id)
                .join(Job, Job.id == Checkpoint.job_id)
                .where(Job.name == job, Checkpoint.step == step)
            ).all()
        found = {f"restorable {t}": (at - created).total_seconds() for t, at, created in rows if at}
        if len(found) != len(TIERS):
            raise RuntimeError(f"{job}: not restorable on every tier: {rows}")
        return found

    async def _finished(self, job: str, step: int) -> None:
        await asyncio.wait_for(self._result(workflow_id(job, step)), WAIT)
        await asyncio.wait_for(self._result(retention_workflow_id(job)), WAIT)

    async def _result(self, wid: str) -> Any:
        # The API starts the lifecycle after it has answered: until then Temporal knows nothing.
        from temporalio.service import RPCError, RPCStatusCode

        while True:
            try:
                return await self.temporal.get_workflow_handle(wid).result()
            except RPCError as e:
                # An overloaded server times the long poll out: ask again.
                if e.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.DEADLINE_EXCEEDED):
                    raise
            await asyncio.sleep(0.05)

    def close(self) -> None:
        try:
            self.fleet.close()
        finally:
            self.loop.close()
