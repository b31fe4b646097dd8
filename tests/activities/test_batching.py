"""How the plan splits a checkpoint's shards into batches (activities/batching.py): ranges of one
node's ordinals, bounded in number, split by bytes when a node would otherwise copy alone."""

from __future__ import annotations

import itertools

from activities.batching import batch_size, make_batches, plan_batches
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch


def test_batches_are_ranges_per_node_and_bounded(settings: Settings) -> None:
    rows = [("node-a", i) for i in range(0, 2000, 2)] + [("node-b", i) for i in range(1, 2000, 2)]
    assert batch_size(settings, 2000) == settings.shard_batch_size
    batches = make_batches(rows, 400)
    # Tiny shards: splitting by bytes changes nothing.
    assert plan_batches([(n, o, 1) for n, o in rows], 400, 4, settings.min_batch_bytes) == batches
    assert batches == [
        Batch(node="node-a", first=0, last=798),
        Batch(node="node-a", first=800, last=1598),
        Batch(node="node-a", first=1600, last=1998),
        Batch(node="node-b", first=1, last=799),
        Batch(node="node-b", first=801, last=1599),
        Batch(node="node-b", first=1601, last=1999),
    ]
    # However many shards, a stage has about max_batches_per_stage batches.
    n = 1_000_000
    assert -(-n // batch_size(settings, n)) <= settings.max_batches_per_stage


MIB = 1024 * 1024


def test_large_shards_of_one_node_split_into_parallelism_ranges_balanced_by_bytes(
    settings: Settings,
) -> None:
    # A 1 GiB checkpoint of 64 shards on one node: one batch by count, four by bytes.
    rows = [("node-a", i, 16 * MIB) for i in range(64)]
    size = batch_size(settings, len(rows))
    assert make_batches([(n, o) for n, o, _ in rows], size) == [
        Batch(node="node-a", first=0, last=63)
    ]
    assert plan_batches(rows, size, 4, settings.min_batch_bytes) == [
        Batch(node="node-a", first=0, last=15),
        Batch(node="node-a", first=16, last=31),
        Batch(node="node-a", first=32, last=47),
        Batch(node="node-a", first=48, last=63),
    ]


def test_tiny_shards_keep_one_batch_per_node(settings: Settings) -> None:
    rows = [(n, o, 64 * 1024) for n in ("node-a", "node-b") for o in range(2)]
    assert plan_batches(rows, 500, 4, settings.min_batch_bytes) == [
        Batch(node="node-a", first=0, last=1),
        Batch(node="node-b", first=0, last=1),
    ]


def test_byte_ranges_never_go_below_the_minimum() -> None:
    # 200 MiB on the node allows three ranges of 64 MiB; the huge first shard is one of them.
    rows = [("node-a", 0, 150 * MIB)] + [("node-a", i, MIB) for i in range(1, 51)]
    batches = plan_batches(rows, 500, 4, 64 * MIB)
    sizes = {o: b for _, o, b in rows}
    assert next(b.first for b in batches) == 0 and batches[-1].last == 50
    assert all(a.last + 1 == z.first for a, z in itertools.pairwise(batches))
    assert all(sum(sizes[o] for o in range(b.first, b.last + 1)) >= 64 * MIB for b in batches)
    assert len(batches) == 1  # 150 + 50: a second range would hold less than 64 MiB
    # Lumpy sizes that allow no second range keep the ranges by count.
    rows = [("node-a", 0, 1024 * MIB)] + [("node-a", i, 1) for i in range(1, 1200)]
    assert plan_batches(rows, 500, 4, 64 * MIB) == make_batches([(n, o) for n, o, _ in rows], 500)
