"""The cost of one checkpoint, as docs/architecture.md ("Cost per checkpoint") states it.

One statement of the formulas, pure and free of product imports: the bound tests compare real
lifecycles with it, and the doc test compares the doc's table with it, so the doc, the model and
the product cannot drift apart unnoticed. Defaults are the product's documented defaults
(`shard_batch_size` 500, `max_batches_per_stage` 64, `min_batch_bytes` 64 MiB, `tier.parallelism`
4). The shape is the lifecycle's since plan, promote and the retention requests became local
activities and node stages got a window per node (LOCAL_STEPS_PATCH).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SHARD_BATCH_SIZE = 500
MAX_BATCHES_PER_STAGE = 64
MIN_BATCH_BYTES = 64 * 1024 * 1024
PARALLELISM = 4
# A stage with more batches runs them in child workflows; the model covers the parent-only shape.
BATCHES_PER_CHILD = 250


def spread(shards: int, nodes: int) -> tuple[int, ...]:
    """`shards` spread as evenly as possible over `nodes` (the first nodes get one more)."""
    return tuple(shards // nodes + (1 if i < shards % nodes else 0) for i in range(nodes))


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's shape: shards per node, the tiers it goes to (the first local, the others
    shared), the batch settings. Every shard has `shard_bytes` (tiny unless said)."""

    shards_per_node: tuple[int, ...]
    tiers: int = 3
    shard_bytes: int = 16
    shard_batch_size: int = SHARD_BATCH_SIZE
    max_batches_per_stage: int = MAX_BATCHES_PER_STAGE
    min_batch_bytes: int = MIN_BATCH_BYTES
    parallelism: int = PARALLELISM
    # Tier copies that retention expired (each adds an `expiring` and an `expired` event).
    expired_copies: int = 0

    @classmethod
    def even(cls, shards: int, nodes: int, tiers: int = 3) -> Checkpoint:
        return cls(spread(shards, nodes), tiers)

    @property
    def shards(self) -> int:
        """S"""
        return sum(self.shards_per_node)

    @property
    def batch_size(self) -> int:
        """B = max(shard_batch_size, ceil(S / max_batches_per_stage))"""
        return max(self.shard_batch_size, math.ceil(self.shards / self.max_batches_per_stage))

    def node_batches(self, shards: int) -> int:
        """b_node = max(ceil(S_node / B), min(p, S_node, floor(bytes_node / M))): by count, or
        split by bytes into up to `parallelism` ranges of at least min_batch_bytes."""
        by_count = math.ceil(shards / self.batch_size)
        by_bytes = min(self.parallelism, shards, shards * self.shard_bytes // self.min_batch_bytes)
        return max(by_count, by_bytes)

    @property
    def batches(self) -> int:
        """b = sum over nodes of b_node, so b <= max_batches_per_stage + p·N: batches never span
        nodes."""
        b = sum(self.node_batches(n) for n in self.shards_per_node)
        assert b <= self.max_batches_per_stage + self.parallelism * len(self.shards_per_node)
        return b

    @property
    def activities(self) -> int:
        """A = T·b: per tier one stage of b batch activities, each through a task queue."""
        assert self.batches <= BATCHES_PER_CHILD, "stages in child workflows: another formula"
        return self.tiers * self.batches

    @property
    def local_activities(self) -> int:
        """L = 1 + 2·T: plan; per tier a promote and a retention request, in the workflow's own
        worker, one marker each."""
        return 1 + 2 * self.tiers

    @property
    def node_window(self) -> int:
        """w = sum over nodes of min(p, b_node): the batches a node-queue stage runs at once."""
        return sum(min(self.parallelism, self.node_batches(n)) for n in self.shards_per_node if n)

    @property
    def workflow_tasks_max(self) -> int:
        """One workflow task to start, then at most one per activity completion: 1 + A. The local
        activities run inside the workflow task that asked for them."""
        return 1 + self.activities

    @property
    def workflow_tasks_min(self) -> int:
        """Completions of one stage's window may share a workflow task: the seal runs on the
        nodes' queues (w at once), then every later tier copies off the sealed copy at once,
        each through its own window, so the copies' completions may share tasks too:
        1 + 2·ceil(b/w)."""
        node_stages = min(self.tiers, 2)
        return 1 + node_stages * math.ceil(self.batches / self.node_window)

    def history_events(self, workflow_tasks: int) -> int:
        """3 events per activity (scheduled, started, completed), one marker per local activity,
        3 per workflow task, and 6: execution started, execution completed, the two patch markers
        (local steps, the fan-out) and their search attribute updates."""
        return 3 * self.activities + self.local_activities + 3 * workflow_tasks + 6

    @property
    def history_events_max(self) -> int:
        """The documented bound, 6·A + L + 9."""
        return self.history_events(self.workflow_tasks_max)

    @property
    def history_events_min(self) -> int:
        return self.history_events(self.workflow_tasks_min)

    @property
    def catalog_events(self) -> int:
        """E = 1 + b + 2·b·(T-1) + T (+ 2 per expired tier copy): registered; sealed per batch;
        copied and verified per batch per later tier; promoted per tier."""
        b, t = self.batches, self.tiers
        return 1 + b + 2 * b * (t - 1) + t + 2 * self.expired_copies

    @property
    def catalog_rows(self) -> int:
        """1 + S + S·T + T + E: checkpoint, shards, replicas, markers, events (the job row is
        written once per job, not per checkpoint)."""
        s, t = self.shards, self.tiers
        return 1 + s + s * t + t + self.catalog_events


# The formulas as the doc's table writes them, by row: what the properties above compute.
FORMULAS = {
    "lifecycle activities": ("A = T·b", "L = 1 + 2·T"),
    "lifecycle history events": (
        "3·A + L + 3·W + 6",
        "W <= 1 + A",
        "W >= 1 + 2·ceil(b/w)",
        "6·A + L + 9",
    ),
    "catalog rows written": ("1 + S + S·T + T + E",),
    "catalog events `E`": ("1 + b + 2·b·(T-1) + T",),
}
