"""The re-replication plan's runs of a lost node's shards read from the tiers below: each shard
from the first tier below that holds it verified, runs that never overlap, and a shard no tier
below holds left out (the promotion names it)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from activities.batching import plan_batches
from activities.peer import _runs_below

BELOW = ["lustre", "s3"]


def test_each_shard_from_the_first_tier_below_that_holds_it() -> None:
    stranded = [("a", 0, 10), ("a", 1, 10), ("a", 2, 10), ("a", 3, 10), ("b", 0, 10)]
    held = {
        ("a", 0): {"lustre", "s3"},
        ("a", 1): {"s3"},
        ("a", 2): set(),
        ("a", 3): {"lustre"},
        ("b", 0): {"lustre"},
    }
    assert _runs_below(stranded, BELOW, held) == [
        ("lustre", [("a", 0, 10)]),
        ("s3", [("a", 1, 10)]),
        ("lustre", [("a", 3, 10)]),
        ("lustre", [("b", 0, 10)]),
    ]


@given(st.lists(st.sampled_from([(), ("lustre",), ("s3",), ("lustre", "s3")]), max_size=40))
def test_runs_batch_into_ranges_that_never_overlap(holdings: list[tuple[str, ...]]) -> None:
    stranded = [("a", i, 1) for i in range(len(holdings))]
    held = {("a", i): set(h) for i, h in enumerate(holdings)}
    runs = _runs_below(stranded, BELOW, held)
    covered = [row[1] for _, run in runs for row in run]
    assert covered == [i for i, h in enumerate(holdings) if h]
    for src, run in runs:
        assert all(src == next(t for t in BELOW if t in held[("a", r[1])]) for r in run)
    ranges = sorted((b.first, b.last) for _, run in runs for b in plan_batches(run, 3, 2, 1))
    for (_, last), (first, _) in pairwise(ranges):
        assert last < first
    # No range holds a shard of another run or one that no tier below holds.
    for src, run in runs:
        for b in plan_batches(run, 3, 2, 1):
            assert all(
                holdings[i] and next(t for t in BELOW if t in holdings[i]) == src
                for i in range(b.first, b.last + 1)
            )
