"""The cost model's arithmetic (benchmarks/cost_at_scale.py): its fit recovers a cost that grows
with batches and one that grows with shards, it reads the harness's JSON, and it prints the
hourly figures for the documented job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cost_at_scale as cas


def _point(shards: int, batches: int) -> cas.Point:
    costs = {
        "history_events": 49 + 18 * batches,
        "activity_tasks": 7 + 3 * batches,
        "retention_events": 12,
        "catalog_rows": 8 + 5 * batches + 4 * shards,
        "catalog_events": 4 + 5 * batches,
        "api_requests": 1,
        "local_activities": 0,
    }
    return cas.Point(shards, batches, {k: float(v) for k, v in costs.items()})


POINTS = [_point(1, 1), _point(100, 2), _point(1000, 2), _point(10_000, 20)]


def test_the_fit_tells_batches_from_shards() -> None:
    assert cas.fit(POINTS, "history_events") == pytest.approx((49, 18, 0), abs=1e-6)
    assert cas.fit(POINTS, "catalog_rows") == pytest.approx((8, 5, 4), abs=1e-6)
    assert cas.fit(POINTS, "retention_events") == pytest.approx((12, 0, 0), abs=1e-6)


def test_one_point_is_a_constant() -> None:
    assert cas.fit([_point(4, 2)], "history_events") == pytest.approx((85, 0, 0))


def test_batches_by_the_current_rule() -> None:
    # 8 shards per node never fill a batch of 500: one batch per node and stage.
    assert cas.default_batches(10_000, 8, 500, 64) == 10_000
    # 2 nodes of 50,000 shards: B = ceil(100,000 / 64) = 1,563, 32 batches per node.
    assert cas.default_batches(2, 50_000, 500, 64) == 64
    # 8 shards of 2 GB per node are split by bytes into `parallelism` ranges per node.
    assert cas.default_batches(10_000, 8, 500, 64, shard_bytes=2e9, parallelism=4) == 40_000
    # ... but never below min_batch_bytes per range.
    assert (
        cas.default_batches(10, 8, 500, 64, shard_bytes=1e6, parallelism=4, min_batch_bytes=4e6)
        == 20
    )


def _results(tmp_path: Path) -> Path:
    rows = []
    for p in POINTS:
        method = f"{p.shards:,} shards"
        rows.append({"method": method, "metric": "batches", "median": p.batches})
        rows += [{"method": method, "metric": k, "median": v} for k, v in p.costs.items()]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"scenarios": {"orchestration": {"rows": rows}}}))
    return path


def test_points_are_read_from_the_benchmark_json(tmp_path: Path) -> None:
    assert cas.points_from_results(_results(tmp_path)) == POINTS


def test_the_documented_job_per_hour(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One batch per node (--parallelism 1: no split by bytes).
    assert cas.main(["--from", str(_results(tmp_path)), "--parallelism", "1"]) == 0
    out = capsys.readouterr().out
    # 10,000 batches per stage: 49 + 18 * 10,000 events per checkpoint, six checkpoints an hour.
    assert "180,049" in out and "1,080,294" in out
    # 80,000 shards of 2 GB: 160 TB per checkpoint on every tier, 960 TB an hour.
    assert "written 160 TB, 960 TB/h" in out
