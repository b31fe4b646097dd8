"""The benchmark smoke, `python -m benchmarks --quick --repeats 1 --only ...`, as CI runs it: every
scenario runs at tiny sizes on services its run starts itself and reports a ratio to its baseline.
Smoke only: no timing is judged (the machines are shared and noisy), only that each scenario ran
and measured something, and each scenario's own shape. One run per method: a smoke proves each
scenario runs and compares, not its figures.

The scenarios run in GROUPS, a test module each, so that the suite's workers run them side by
side; a group's run shares its services (the dev stack, the torch venv) between its scenarios
and nothing with another group's run. Every scenario is in exactly one group
(test_bench_groups.py holds it to that)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Guards against a hang, not a performance assertion: below pytest's own timeout, so that a hung
# run is stopped here, its services with it, and its output shown.
HANG_GUARD = 540
QUICK = [sys.executable, "-m", "benchmarks", "--quick", "--repeats", "1"]

GROUPS: dict[str, tuple[str, ...]] = {
    # No services of the harness but a moto server of its own.
    "files": (
        "copy_posix",
        "page_cache",
        "bandwidth_limit",
        "s3_upload",
        "s3_shaping",
        "memory",
        "erasure",
    ),
    # Each on a Postgres (and API processes) of its own.
    "catalog": (
        "register_latency",
        "catalog_reads",
        "retention_snapshot",
        "replica_writes",
        "leases",
        "timeline",
    ),
    # On one dev stack and the torch venv.
    "dcp": (
        "dcp",
        "dcp_load",
        "dcp_requests",
        "checkpoint_visible",
        "end_to_end",
        "restore",
        "recovery",
    ),
    # On another dev stack: the lifecycles under load.
    "stack": ("sustained", "orchestration", "scale"),
    # On a dev stack of its own and the trainers venv: torchtitan's own runs.
    "trainers": ("torchtitan",),
}

Doc = dict[str, Any]


def run(names: Sequence[str], tmp_path: Path) -> tuple[Doc, str]:
    """The run of these scenarios: its JSON document and its printed table."""
    only = [a for name in names for a in ("--only", name)]
    doc, stdout = invoke([*QUICK, *only], tmp_path)
    assert set(doc["scenarios"]) == set(names)
    check_rows(doc)
    for name in names:
        # The table was printed too, with every scenario's title.
        assert f"{name}:" in stdout
        shape = SHAPES.get(name)
        if shape is not None:
            shape(doc)
    return doc, stdout


def invoke(command: Sequence[str], tmp_path: Path) -> tuple[Doc, str]:
    """A run of `python -m benchmarks ...` (`command`, without `--out`), stopped if it hangs: its
    JSON document and its printed table."""
    out = tmp_path / "results.json"
    # A session of its own: a run stopped for hanging takes its dev stack and servers with it.
    with subprocess.Popen(
        # The work dir in the system's temp dir (the harness's default), not under pytest's
        # basetemp: each test worker that starts re-chmods that tree to 0700, which would lock
        # the Postgres server user of another group's run out of its data dir.
        [*command, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            # SIGINT: the harness closes its scenarios and services on the way out.
            proc.send_signal(signal.SIGINT)
            try:
                stdout, stderr = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            raise AssertionError(
                f"hung for {HANG_GUARD}s: {stdout[-4000:]}{stderr[-8000:]}"
            ) from None
    assert proc.returncode == 0, stdout[-4000:] + stderr[-8000:]
    doc: Doc = json.loads(out.read_text())
    return doc, stdout


def check_rows(doc: Doc) -> None:
    """Every row has a value per repeat, above 0; every scenario compares a row to a baseline."""
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
        medians = {r["label"]: r["median"] for r in rows}
        for r in compared:
            if (r["unit"] == "n" or "CPU" in r["label"]) and not (
                r["median"] and medians[r["baseline"]]
            ):
                continue  # a count (or a CPU reading) of 0, or one against 0: no ratio
            assert r["ratio"] is not None and r["ratio"] > 0, (name, r)


def rows(doc: Doc, name: str) -> dict[str, dict[str, Any]]:
    return {r["label"]: r for r in doc["scenarios"][name]["rows"]}


def _recovery(doc: Doc) -> None:
    # Each source's load is compared to a local load, S3's also to the peer's, in the same run;
    # each read every byte from its own source.
    recovery = rows(doc, "recovery")
    local = "local load (the node's own local tier)"
    nbytes = doc["scenarios"]["recovery"]["params"]["bytes"]
    for source in ("a peer's data endpoint", "the shared tier", "S3"):
        assert recovery[f"load from {source}"]["baseline"] == local
        assert recovery[f"load from {source}: bytes read"]["values"] == [nbytes] * doc["repeats"]
    assert (
        recovery["load from S3, against the peer's"]["baseline"]
        == "load from a peer's data endpoint"
    )


def _dcp(doc: Doc) -> None:
    # The headline, against its baseline in the same run.
    assert rows(doc, "dcp")["TierpointWriter save"]["baseline"] == "S3StorageWriter save"


def _end_to_end(doc: Doc) -> None:
    e2e = rows(doc, "end_to_end")
    total = e2e["tierpoint: registration -> restorable on S3"]
    assert total["baseline"] == "raw: cp+sync local->shared + boto3 upload shared->S3"
    # Every stage has a time of its own: the seal after the registration, and each later tier
    # after the seal it copies from (the copies fan out from the sealed tier; the values are
    # differences of the catalog's restorable_at; all were checked > 0).
    stages = ("sealed on ssd (from registration)", "ssd -> shared", "sealed -> S3")
    assert len([label for label in e2e if any(s in label for s in stages)]) == 3


def _sustained(doc: Doc) -> None:
    # The sustained rate says which of the stack's processes were busy.
    cores = doc["scenarios"]["sustained"]["rows"][-1]["cpu_cores"]
    assert {"api", "workers", "temporal", "postgres", "moto"} <= set(cores)
    # The storm says where a registration's time went: the API's CPU and its wait for one.
    storm = rows(doc, "sustained")
    for row in ("registration mean", "API CPU per registration", "API waiting for a CPU"):
        assert any(label.startswith(f"tierpoint storm: {row}") for label in storm), storm
    # And what a storm checkpoint costs each of the stack's processes, and all of them.
    per_process = {
        name: storm[f"tierpoint storm: CPU per checkpoint, {name}"]["median"]
        for name in ("workers", "temporal", "api", "postgres", "moto")
    }
    assert all(cpu > 0 for cpu in per_process.values()), per_process
    stack_cpu = storm["tierpoint storm: CPU per checkpoint, the stack's processes"]["median"]
    assert stack_cpu >= max(per_process.values()), (stack_cpu, per_process)


def _catalog_reads(doc: Doc) -> None:
    # The 10x catalog's rows are its growth over the 1x one, the 1x rows are compared to a
    # trivial authenticated GET.
    reads = rows(doc, "catalog_reads")
    assert reads["latest restorable p99 @10x"]["baseline"] == "latest restorable p99 @1x"
    assert reads["latest restorable p99 @1x"]["baseline"] == "GET /v1/tiers p99 @1x"


def _register_latency(doc: Doc) -> None:
    # Every size with Temporal idle, busy and down, compared to idle, and the API's CPU per
    # request.
    reg = rows(doc, "register_latency")
    for n in doc["scenarios"]["register_latency"]["params"]["shards"]:
        assert reg[f"new {n} p99"]["baseline"] == f"retry {n} p99"
        for cond in ("busy", "down"):
            assert reg[f"new {n}, temporal {cond} p50"]["baseline"] == f"new {n} p50"
            assert f"new {n}, temporal {cond} API CPU/request" in reg


def _orchestration(doc: Doc) -> None:
    # Every shard count ran a real lifecycle that Temporal, the catalog and the API saw; its
    # history does not grow with shards (1,000 shards in a few batches).
    orch = rows(doc, "orchestration")
    for n in ("1", "100", "1,000"):
        for what in ("history events (all workflows)", "catalog rows written", "API requests"):
            assert orch[f"{n} shards: {what}"]["median"] >= 1, (n, what)
    assert orch["1,000 shards: catalog rows written"]["median"] > 1000  # a row per shard at least
    assert orch["1,000 shards: history events (all workflows)"]["median"] < 1000


def _copy_posix(doc: Doc) -> None:
    # Both copy shapes, each copy + verify against cp+sync alone (the target).
    copies = rows(doc, "copy_posix")
    for shape in ("1 x 16 MiB", "16 x 1 MiB"):
        assert copies[f"{shape}: PosixStore copy+verify"]["baseline"] == f"{shape}: cp+sync"


def _bandwidth_limit(doc: Doc) -> None:
    # The read limit's loader against disk - L.
    limits = [r["baseline"] for r in doc["scenarios"]["bandwidth_limit"]["rows"]]
    assert "loader beside the copy, L = 0.5 x disk: the time at disk - L" in limits


def _scale(doc: Doc) -> None:
    # Node workers serving 10 nodes' queues from one process made a checkpoint of 8 shards per
    # node restorable on every tier; the restart storm of its 80 ranks cost the API 2 + 2R
    # requests in the reader's old call pattern and 2 in today's.
    scale = rows(doc, "scale")
    assert scale["10 nodes: activity tasks"]["median"] == 30  # 10 batches x 3 tiers
    storm = "10 nodes: restart storm of 80 ranks, API requests"
    assert scale[f"{storm}: per-rank (before)"]["median"] == 2 + 2 * 80
    assert scale[f"{storm}: coordinator only (after)"]["median"] == 2
    failed = "10 nodes: restart storm of 80 ranks, requests failed after retries"
    assert scale[f"{failed}: per-rank (before)"]["median"] == 0
    assert scale[f"{failed}: coordinator only (after)"]["median"] == 0


def _leases(doc: Doc) -> None:
    # Leases on one checkpoint against the same spread over many, every answer a success.
    leases = rows(doc, "leases")
    one = "leases on one checkpoint"
    assert leases[f"{one}: p99"]["baseline"] == "leases, each on another checkpoint: p99"
    releases = "releases of the leases on one checkpoint"
    assert leases[f"{releases}: p99"]["baseline"] == f"{one}: p99"
    for method in (one, releases, "restores of the latest checkpoint"):
        assert leases[f"{method}: 5xx answers"]["values"] == [0] * doc["repeats"]
        assert leases[f"{method}: other failures"]["values"] == [0] * doc["repeats"]
        assert leases[f"{method}: API CPU per request"]["median"] > 0


def _page_cache(doc: Doc) -> None:
    # Both settings, each load against the load with no copy in between; what each left cached
    # (mincore: a fact, not a timing).
    cache = rows(doc, "page_cache")
    for policy, newest, older in (("keep_newest", 100, 0), ("drop", 0, 100)):
        label = f"page_cache = {policy}"
        base = cache[f"{label}: load right after the copy"]["baseline"]
        assert base == "load, no copy (as the save left it): load"
        assert cache[f"{label}: newest checkpoint's pages cached (%)"]["median"] == newest
        assert cache[f"{label}: older checkpoint's pages cached (%)"]["median"] == older


def _erasure(doc: Doc) -> None:
    # Both codes coded and decoded against the same memcpy; the holders' memory is the stripe
    # format's, so it is exact: (k+m)/k of the checkpoint, headers included, against 2 copies.
    erasure = rows(doc, "erasure")
    for code in ("rs(8,2)", "rs(4,2)"):
        for what in ("encode", "decode"):
            assert any(label.startswith(f"{what} {code}") for label in erasure), (what, code)
    memory = "holders' bytes per checkpoint byte: "
    assert erasure[memory + "copies = 2"]["median"] == 2
    assert 1.25 <= erasure[memory + "rs(8,2)"]["median"] < 1.26
    assert 1.5 <= erasure[memory + "rs(4,2)"]["median"] < 1.51


SHAPES: dict[str, Callable[[Doc], None]] = {
    "erasure": _erasure,
    "leases": _leases,
    "page_cache": _page_cache,
    "recovery": _recovery,
    "dcp": _dcp,
    "end_to_end": _end_to_end,
    "sustained": _sustained,
    "catalog_reads": _catalog_reads,
    "register_latency": _register_latency,
    "orchestration": _orchestration,
    "copy_posix": _copy_posix,
    "bandwidth_limit": _bandwidth_limit,
    "scale": _scale,
}
