"""The re-replication plan's runs: each shard read from the fastest tier that holds it verified
(its node's local copy, another peer tier's holder, the shared tier, S3), runs that never
overlap, and a shard no tier holds left out (the promotion names it)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from activities.batching import plan_batches
from activities.peer import _runs

ORDER = ["ssd", "peer.2", "lustre", "s3"]
WHERE = {"ssd": "a", "peer.2": "h", "lustre": None, "s3": None}


def test_each_shard_from_the_fastest_tier_that_holds_it() -> None:
    rows = [("a", 0, 10), ("a", 1, 10), ("a", 2, 10), ("a", 3, 10), ("a", 4, 10), ("b", 0, 10)]
    verified: dict[tuple[str, int], dict[str, str | None]] = {
        # Its local copy is still there: read off its node.
        ("a", 0): {"ssd": "a", "peer.2": "h", "s3": None},
        # Expired locally: the other peer copy, on its holder h.
        ("a", 1): {"peer.2": "h", "lustre": None},
        ("a", 2): {},
        ("a", 3): {"lustre": None, "s3": None},
        ("a", 4): {"s3": None},
        ("b", 0): {"lustre": None},
    }
    assert _runs(rows, ORDER, verified) == [
        (("ssd", "a"), [("a", 0, 10)]),
        (("peer.2", "h"), [("a", 1, 10)]),
        (("lustre", None), [("a", 3, 10)]),
        (("s3", None), [("a", 4, 10)]),
        (("lustre", None), [("b", 0, 10)]),
    ]


HOLDINGS = st.sampled_from([(), ("ssd",), ("peer.2",), ("lustre",), ("s3",), ("peer.2", "s3")])


@given(st.lists(HOLDINGS, max_size=40))
def test_runs_batch_into_ranges_that_never_overlap(holdings: list[tuple[str, ...]]) -> None:
    rows = [("a", i, 1) for i in range(len(holdings))]
    verified = {("a", i): {t: WHERE[t] for t in h} for i, h in enumerate(holdings)}
    runs = _runs(rows, ORDER, verified)
    covered = [row[1] for _, run in runs for row in run]
    assert covered == [i for i, h in enumerate(holdings) if h]

    def fastest(i: int) -> str:
        return next(t for t in ORDER if t in holdings[i])

    for (src, at), run in runs:
        assert all(src == fastest(r[1]) for r in run) and at == WHERE[src]
    ranges = sorted((b.first, b.last) for _, run in runs for b in plan_batches(run, 3, 2, 1))
    for (_, last), (first, _) in pairwise(ranges):
        assert last < first
    # No range holds a shard of another run or one that no tier holds.
    for (src, _), run in runs:
        for b in plan_batches(run, 3, 2, 1):
            assert all(holdings[i] and fastest(i) == src for i in range(b.first, b.last + 1))
