"""`python -m benchmarks --quick --repeats 1` as CI runs it: every scenario runs at tiny sizes on
the services the harness starts itself and reports a ratio to its baseline. Smoke only: no timing
is judged (the machines are shared and noisy), only that each scenario ran and measured something.
One run per method: a smoke proves each scenario runs and compares, not its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
HEADLINE = "TierpointWriter save"  # its baseline: S3StorageWriter save, in the same run
HANG_GUARD = 900
QUICK = [sys.executable, "-m", "benchmarks", "--quick", "--repeats", "1"]


def test_quick_run_measures_every_scenario_against_its_baseline(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [*QUICK, "--out", str(out), "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    doc = json.loads(out.read_text())
    assert set(doc["scenarios"]) == set(SCENARIOS)
    repeats = doc["repeats"]
    for name, result in doc["scenarios"].items():
        rows = result["rows"]
        compared = [r for r in rows if r["baseline"] is not None]
        assert compared, f"{name}: no row is compared to a baseline"
        for r in rows:
            assert len(r["values"]) == repeats, (name, r)
            # A count may be 0 (e.g. local activities of a lifecycle that has none), and so may
            # CPU seconds read from /proc (10 ms ticks: a process idle during a short run); a
            # time not.
            zero_ok = r["unit"] == "n" or "CPU" in r["label"]
            assert all(v > 0 or (zero_ok and v == 0) for v in r["values"]), (name, r)
        for r in compared:
            if (r["unit"] == "n" or "CPU" in r["label"]) and not r["median"]:
                continue  # a count (or a CPU reading) of 0: no ratio
            assert r["ratio"] is not None and r["ratio"] > 0, (name, r)
    # Recovery: each source's load is compared to a local load, S3's also to the peer's, in the
    # same run; each read every byte from its own source.
    recovery = {r["label"]: r for r in doc["scenarios"]["recovery"]["rows"]}
    local = "local load (the node's own local tier)"
    nbytes = doc["scenarios"]["recovery"]["params"]["bytes"]
    for source in ("a peer's data endpoint", "the shared tier", "S3"):
        assert recovery[f"load from {source}"]["baseline"] == local
        assert recovery[f"load from {source}: bytes read"]["values"] == [nbytes] * repeats
    assert (
        recovery["load from S3, against the peer's"]["baseline"]
        == "load from a peer's data endpoint"
    )
    dcp = {r["label"]: r for r in doc["scenarios"]["dcp"]["rows"]}
    assert dcp[HEADLINE]["baseline"] == "S3StorageWriter save"
    e2e = {r["label"]: r for r in doc["scenarios"]["end_to_end"]["rows"]}
    total = e2e["tierpoint: registration -> restorable on S3"]
    assert total["baseline"] == "raw: cp+sync local->shared + boto3 upload shared->S3"
    # Every stage has a time of its own: each tier became restorable after the one before it
    # (the values are differences of the catalog's restorable_at; all were checked > 0 above).
    stages = ("sealed on ssd (from registration)", "ssd -> shared", "shared -> S3")
    assert len([label for label in e2e if any(s in label for s in stages)]) == 3
    # The sustained rate says which of the stack's processes were busy.
    cores = doc["scenarios"]["sustained"]["rows"][-1]["cpu_cores"]
    assert {"api+workers", "temporal", "postgres", "moto"} <= set(cores)
    # Catalog reads: the 10x catalog's rows are its growth over the 1x one, the 1x rows are
    # compared to a trivial authenticated GET.
    reads = {r["label"]: r for r in doc["scenarios"]["catalog_reads"]["rows"]}
    assert reads["latest restorable p99 @10x"]["baseline"] == "latest restorable p99 @1x"
    assert reads["latest restorable p99 @1x"]["baseline"] == "GET /v1/tiers p99 @1x"
    # Registration: every size with Temporal idle, busy and down, compared to idle, and the API's
    # CPU per request.
    reg = {r["label"]: r for r in doc["scenarios"]["register_latency"]["rows"]}
    for n in doc["scenarios"]["register_latency"]["params"]["shards"]:
        assert reg[f"new {n} p99"]["baseline"] == f"retry {n} p99"
        for cond in ("busy", "down"):
            assert reg[f"new {n}, temporal {cond} p50"]["baseline"] == f"new {n} p50"
            assert f"new {n}, temporal {cond} API CPU/request" in reg
    # Orchestration: every shard count ran a real lifecycle that Temporal, the catalog and the
    # API saw; its history does not grow with shards (1,000 shards in a few batches).
    orch = {r["label"]: r for r in doc["scenarios"]["orchestration"]["rows"]}
    for n in ("1", "100", "1,000"):
        for what in ("history events (all workflows)", "catalog rows written", "API requests"):
            assert orch[f"{n} shards: {what}"]["median"] >= 1, (n, what)
    assert orch["1,000 shards: catalog rows written"]["median"] > 1000  # a row per shard at least
    assert orch["1,000 shards: history events (all workflows)"]["median"] < 1000
    # Both copy shapes, each copy + verify against cp+sync alone (the target) and cp+sync with a
    # cold read-back; the read limit's loader against disk - L.
    copies = {r["label"]: r for r in doc["scenarios"]["copy_posix"]["rows"]}
    for shape in ("1 x 16 MiB", "16 x 1 MiB"):
        assert copies[f"{shape}: PosixStore copy+verify"]["baseline"] == f"{shape}: cp+sync"
    limits = [r["baseline"] for r in doc["scenarios"]["bandwidth_limit"]["rows"]]
    assert "loader beside the copy, L = 0.5 x disk: the time at disk - L" in limits
    # Scale: node workers serving 10 nodes' queues from one process made a checkpoint of 8 shards
    # per node restorable on every tier; the restart storm of its 80 ranks cost the API 2 + 2R
    # requests in the reader's old call pattern and 2 in today's.
    scale = {r["label"]: r for r in doc["scenarios"]["scale"]["rows"]}
    assert scale["10 nodes: activity tasks"]["median"] == 30  # 10 batches x 3 tiers
    storm = "10 nodes: restart storm of 80 ranks, API requests"
    assert scale[f"{storm}: per-rank (before)"]["median"] == 2 + 2 * 80
    assert scale[f"{storm}: coordinator only (after)"]["median"] == 2
    # The table was printed too, with every scenario's title.
    for name in SCENARIOS:
        assert f"{name}:" in proc.stdout
