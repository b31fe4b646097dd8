"""The cost of one checkpoint, as docs/architecture.md ("Cost per checkpoint") states it.

One statement of the formulas, pure and free of product imports: the bound tests compare real
lifecycles with it, and the doc test compares the doc's table with it, so the doc, the model and
the product cannot drift apart unnoticed. Defaults are the product's documented defaults
(`shard_batch_size` 500, `max_batches_per_stage` 64, `tier.parallelism` 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SHARD_BATCH_SIZE = 500
MAX_BATCHES_PER_STAGE = 64
PARALLELISM = 4
# A stage with more batches runs them in child workflows; the model covers the parent-only shape.
BATCHES_PER_CHILD = 1000


def spread(shards: int, nodes: int) -> tuple[int, ...]:
    """`shards` spread as evenly as possible over `nodes` (the first nodes get one more)."""
    return tuple(shards // nodes + (1 if i < shards % nodes else 0) for i in range(nodes))


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's shape: shards per node, the tiers it goes to, the batch settings."""

    shards_per_node: tuple[int, ...]
    tiers: int = 3
    shard_batch_size: int = SHARD_BATCH_SIZE
    max_batches_per_stage: int = MAX_BATCHES_PER_STAGE
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

    @property
    def batches(self) -> int:
        """b = sum over nodes of ceil(S_node / B): batches never span nodes."""
        return sum(math.ceil(n / self.batch_size) for n in self.shards_per_node)

    @property
    def activities(self) -> int:
        """A = 1 + T·(b + 2): plan; per tier b batch activities, a promote, a retention request."""
        assert self.batches <= BATCHES_PER_CHILD, "stages in child workflows: another formula"
        return 1 + self.tiers * (self.batches + 2)

    @property
    def workflow_tasks_max(self) -> int:
        """One workflow task to start, then at most one per activity completion: 1 + A."""
        return 1 + self.activities

    @property
    def workflow_tasks_min(self) -> int:
        """Completions of one stage's window may share a workflow task (at best `parallelism` at
        a time); plan, promote and retention request complete alone: 2 + 2·T + T·ceil(b/p)."""
        per_stage = math.ceil(self.batches / self.parallelism)
        return 2 + 2 * self.tiers + self.tiers * per_stage

    def history_events(self, workflow_tasks: int) -> int:
        """3 events per activity (scheduled, started, completed), 3 per workflow task, and 4:
        execution started, execution completed, the patch marker and its search attribute."""
        return 3 * self.activities + 3 * workflow_tasks + 4

    @property
    def history_events_max(self) -> int:
        """The documented bound, 6·A + 7."""
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
    "lifecycle activities": ("A = 1 + T·(b+2)",),
    "lifecycle history events": (
        "3·A + 3·W + 4",
        "W <= 1 + A",
        "W >= 2 + 2·T + T·ceil(b/p)",
        "6·A + 7",
    ),
    "catalog rows written": ("1 + S + S·T + T + E",),
    "catalog events `E`": ("1 + b + 2·b·(T-1) + T",),
}
