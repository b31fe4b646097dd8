"""How the plan splits a checkpoint's shards into batches: contiguous ranges of manifest
ordinals of one node, one activity each per stage.

By count, a stage has about `max_batches_per_stage` batches however many shards there are, so
the history grows with batches, not shards. A node left with fewer batches than the
`parallelism` of the stages on the nodes' queues (the first two tiers'; every node with fewer
than `shard_batch_size` shards: one batch) would copy its shards one after another inside one
activity while its window stays empty; such a node's
shards are split into up to `parallelism` ranges balanced by bytes, none below
`min_batch_bytes`, so large shards copy side by side and tiny ones keep one batch per node.
Per node: `b_node = max(ceil(S_node / B), min(parallelism, S_node, floor(bytes_node / M)))`,
hence `b <= max_batches_per_stage + parallelism * N`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby, pairwise

from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch


def batch_size(settings: Settings, shard_count: int) -> int:
    """History grows with batches, not shards: at most about max_batches_per_stage batches."""
    return max(settings.shard_batch_size, math.ceil(shard_count / settings.max_batches_per_stage))


def make_batches(ordinals_by_node: Sequence[tuple[str, int]], size: int) -> list[Batch]:
    """Ranges of at most `size` shards, per node."""
    batches = []
    for node, group in groupby(ordinals_by_node, key=lambda r: r[0]):
        ordinals = [o for _, o in group]
        for i in range(0, len(ordinals), size):
            chunk = ordinals[i : i + size]
            batches.append(Batch(node=node, first=chunk[0], last=chunk[-1]))
    return batches


def split_by_bytes(sizes: Sequence[int], pieces: int, min_bytes: int) -> list[int]:
    """Where to cut `sizes` (in order) into at most `pieces` contiguous ranges of about equal
    bytes, none below `min_bytes` (the last may be, when the whole is): the start index of each
    range after the first."""
    total = sum(sizes)
    cuts: list[int] = []
    start_bytes = 0  # bytes before the current range
    acc = 0
    for i, size in enumerate(sizes[:-1]):
        acc += size
        if len(cuts) == pieces - 1:
            break
        in_range = acc - start_bytes
        # Close the range once it holds its share of what is left for the remaining ranges, if
        # both it and what follows are at least min_bytes.
        share = (total - start_bytes) / (pieces - len(cuts))
        if in_range >= share and in_range >= min_bytes and total - acc >= min_bytes:
            cuts.append(i + 1)
            start_bytes = acc
    return cuts


def plan_batches(
    shards_by_node: Sequence[tuple[str, int, int]],
    size: int,
    parallelism: int,
    min_bytes: int,
) -> list[Batch]:
    """The batches of one checkpoint: `(node, ordinal, bytes)` ordered by node and ordinal,
    `size` shards per batch at most (batch_size), and per node at least `parallelism` batches
    where its bytes allow ranges of `min_bytes` or more."""
    batches: list[Batch] = []
    for node, group in groupby(shards_by_node, key=lambda r: r[0]):
        rows = list(group)
        by_count = make_batches([(node, o) for _, o, _ in rows], size)
        node_bytes = sum(b for _, _, b in rows)
        pieces = min(parallelism, len(rows), node_bytes // min_bytes)
        cuts = (
            split_by_bytes([b for _, _, b in rows], pieces, min_bytes)
            if pieces > len(by_count)
            else []
        )
        if len(cuts) + 1 <= len(by_count):
            # Lumpy sizes (one huge shard among tiny ones) may not split into more ranges.
            batches.extend(by_count)
            continue
        starts = [0, *cuts, len(rows)]
        batches.extend(
            Batch(node=node, first=rows[a][1], last=rows[z - 1][1]) for a, z in pairwise(starts)
        )
    return batches
