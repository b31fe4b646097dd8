"""A batch's copy to one destination from one or more sources (`copy_to`), and the replicas it
marks in flight first (`mark_copying`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tierpoint.catalog.checkpoint.shards import BatchShard
from tierpoint.catalog.replica.machine import ReplicaWrite
from tierpoint.contract.lifecycle import BatchResult
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, ShardSource, TierStore
from tierpoint.tier_config import TierConfig

from ..progress import BatchReporter
from ._batch import BatchCopy


@dataclass(frozen=True)
class Destination:
    """Where a batch's shards are copied to, and what the copy reports to."""

    job: str
    step: int
    tier: TierConfig
    store: TierStore
    node: str | None  # the node of a local tier's replicas
    reporter: BatchReporter
    result: BatchResult
    heartbeat_details: dict[str, Any]
    attempt: int
    branch: int = 1


@dataclass(frozen=True)
class Source:
    tier: TierConfig
    store: ShardSource
    shards: list[BatchShard]


def mark_copying(dest: Destination, sources: Sequence[Source]) -> None:
    """Every shard's replica on `dest` becomes `copying`, queued on the reporter: the caller writes
    it in the transaction that read the batch, or `copy_to` flushes it before the first byte
    moves, so the operator views show the whole batch in flight."""
    for source in sources:
        for sh in source.shards:
            location = dest.store.location(ShardRef(dest.job, dest.step, sh.path, dest.branch))
            dest.reporter.replica(ReplicaWrite(sh.id, ReplicaState.COPYING, location, dest.node))


def copy_to(dest: Destination, sources: Sequence[Source]) -> list[BatchCopy]:
    """Copy + verify each source's shards to `dest`, after `mark_copying` (written here if the
    caller has not). What the copies found is left on the reporter for the caller's last
    transaction (`BatchReporter.finish`), with its events. Returns the copies, one per source,
    for what they resumed and rewrote."""
    dest.reporter.flush()
    copies = []
    for source in sources:
        copy = BatchCopy(
            job=dest.job,
            step=dest.step,
            src_tier=source.tier,
            dst_tier=dest.tier,
            src=source.store,
            dst=dest.store,
            dst_node=dest.node,
            reporter=dest.reporter,
            result=dest.result,
            heartbeat_details=dest.heartbeat_details,
            attempt=dest.attempt,
            branch=dest.branch,
        )
        copy.run(source.shards)
        copies.append(copy)
    return copies
