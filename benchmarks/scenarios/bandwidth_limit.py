"""Copies must not starve training: the per-node read bandwidth limit of a local tier, measured.

The disk's read bandwidth D is what a reader alone gets, cold (O_DIRECT, so neither the page cache
nor readahead of an earlier run helps it); measured in `prepare`, untimed, then again as a row.
The copy is the product's path off a local tier (`PosixStore.open_read` of a tier with
`read_bandwidth_limit = L`, through its `TokenBucket`, into `PosixStore.write`) at L = D/4 and
D/2, each alone and with the stand-in for the training job's data loader: the same O_DIRECT reader
looping over another file of the same disk for as long as the copy runs. The copy writes to
/dev/shm when it has room, so that only the reads share the disk (as they do on a node whose
shared tier is a network file system); else to the same disk, which the caption then says.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.env import ROOT, Env, json_line
from benchmarks.harness import Method, Outcome, Row, Scenario
from benchmarks.scenarios.copy_posix import drop_cache, make_sources
from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig, TierKind

JOB, STEP, SHARD = "bench", 1, "shard-000.bin"
READ = 8 * 1024 * 1024  # the data loader's request size
FRACTIONS = (0.25, 0.5)
SHM = Path("/dev/shm")


def direct_read(
    path: Path, stop: threading.Event | None = None, log: list[tuple[float, int]] | None = None
) -> tuple[int, float]:
    """(bytes, seconds) of a cold sequential reader: the whole file once, or, given `stop`, round
    and round until it is set; `log` gets (time.monotonic(), bytes so far) after every read."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, READ)
    total, offset = 0, 0
    t0 = time.perf_counter()
    if log is not None:
        log.append((time.monotonic(), 0))
    try:
        while True:
            n = os.preadv(fd, [buf], offset)
            total += n
            offset += n
            if log is not None:
                log.append((time.monotonic(), total))
            if n < READ:
                if stop is None:
                    break
                offset = 0
            if stop is not None and stop.is_set():
                break
    finally:
        os.close(fd)
        buf.close()
    return total, time.perf_counter() - t0


def copy_child(src: Path, dst: Path, limit: int) -> None:
    a = PosixStore(
        TierConfig(
            name="ssd", kind=TierKind.LOCAL, root=str(src / "{node}"), read_bandwidth_limit=limit
        ),
        "node-1",
    )
    b = PosixStore(TierConfig(name="lustre", kind=TierKind.SHARED, root=str(dst)))
    ref = ShardRef(JOB, STEP, SHARD)
    size = a.size(ref)
    assert size is not None
    # CLOCK_MONOTONIC is one clock for every process: the parent places the copy's span on the
    # loader's log with it.
    t0 = time.monotonic()
    with a.open_read(ref) as f:
        b.write(ref, f, size, None, None)
    print(json.dumps({"start": t0, "end": time.monotonic()}))


def rate_within(log: list[tuple[float, int]], start: float, end: float) -> float:
    """Bytes/s the logged reader kept between start and end: over its reads that completed in the
    span, or, where they read nothing (a tiny copy), over the fewest reads enclosing it. (A read
    at the end of the file returns nothing and logs the same count again.)"""
    inside = [k for k, (t, _) in enumerate(log) if start <= t <= end]
    i, j = (inside[0], inside[-1]) if inside else (0, len(log) - 1)
    if not inside:
        i = max([k for k, (t, _) in enumerate(log) if t < start], default=0)
        j = min([k for k, (t, _) in enumerate(log) if t > end], default=len(log) - 1)
    while log[j][1] == log[i][1] and (i > 0 or j < len(log) - 1):
        i, j = max(i - 1, 0), min(j + 1, len(log) - 1)
    if log[j][1] == log[i][1] or log[j][0] <= log[i][0]:
        raise SystemExit("the loader was not reading while the copy ran")
    return (log[j][1] - log[i][1]) / (log[j][0] - log[i][0])


def _label(fraction: float) -> str:
    return f"L = {fraction:g} x disk"


class BandwidthLimit(Scenario):
    name = "bandwidth_limit"
    summary = "the per-node read bandwidth limit L: a copy's throughput, and a concurrent reader's"

    def __init__(self, env: Env, mib: int) -> None:
        self.nbytes = mib * 1024 * 1024
        self.work = env.work / self.name
        # Where the local tier's node root is: {work}/ssd/node-1/bench/1/shard-000.bin.
        self.ssd = self.work / "ssd"
        self.loader_file = self.work / "loader" / "data.bin"
        on_shm = SHM.is_dir() and shutil.disk_usage(SHM).free > 4 * self.nbytes
        self.dst = (SHM if on_shm else self.work) / f"tierpoint-bench-dst-{os.getpid()}"
        self.disk = 0.0  # bytes/s, the reader alone

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "disk_read_MBps": round(self.disk / 1e6),
            "limits_MBps": [round(self.disk * f / 1e6) for f in FRACTIONS],
            "copy_writes_to": "tmpfs" if self.dst.parent == SHM else "the same disk",
        }

    def prepare(self) -> list[Method]:
        make_sources(self.ssd / "node-1", self.nbytes, 1)
        make_sources(self.loader_file.parent, self.nbytes, 1)
        self.loader_file = next((self.loader_file.parent / JOB / str(STEP)).iterdir())
        samples = [direct_read(self.loader_file) for _ in range(3)]
        self.disk = statistics.median(n / s for n, s in samples)
        methods = [
            Method(
                "loader alone",
                self._loader_alone,
                (Row("data loader alone (disk read bandwidth)", nbytes=self.nbytes),),
            )
        ]
        for f in FRACTIONS:
            limit = int(self.disk * f)
            lab = _label(f)
            at_limit = Row(f"copy, {lab}: the time at exactly L", "at_limit", nbytes=self.nbytes)
            methods.append(
                Method(
                    f"copy alone, {lab}",
                    self._runner(limit, loader=False),
                    (
                        at_limit,
                        Row(f"copy alone, {lab}", baseline=at_limit.label, nbytes=self.nbytes),
                    ),
                    before=self._reset,
                    after=self._clean,
                )
            )
            floor = Row(
                f"loader beside the copy, {lab}: the time at disk - L", "floor", nbytes=self.nbytes
            )
            methods.append(
                Method(
                    f"copy + loader, {lab}",
                    self._runner(limit, loader=True),
                    (
                        Row(
                            f"copy beside the loader, {lab}",
                            baseline=at_limit.label,
                            nbytes=self.nbytes,
                        ),
                        floor,
                        Row(f"loader beside the copy, {lab}", "loader", floor.label, self.nbytes),
                        Row(
                            f"loader beside the copy, {lab} (vs alone)",
                            "loader",
                            "data loader alone (disk read bandwidth)",
                            self.nbytes,
                        ),
                    ),
                    before=self._reset,
                    after=self._clean,
                )
            )
        return methods

    def _loader_alone(self) -> Outcome:
        n, seconds = direct_read(self.loader_file)
        return Outcome({"seconds": seconds * self.nbytes / n})

    def _reset(self) -> None:
        self._clean()
        drop_cache(self.ssd)

    def _clean(self) -> None:
        shutil.rmtree(self.dst, ignore_errors=True)

    def _runner(self, limit: int, *, loader: bool) -> Callable[[], Outcome]:
        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.bandwidth_limit"]
            cmd += ["--src", str(self.ssd), "--dst", str(self.dst), "--limit", str(limit)]
            stop = threading.Event()
            log: list[tuple[float, int]] = []
            reader = threading.Thread(target=direct_read, args=(self.loader_file, stop, log))
            if loader:
                reader.start()
            try:
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            finally:
                stop.set()
                if loader:
                    reader.join()
            r = json_line(out.stdout)
            start, end = float(r["start"]), float(r["end"])  # type: ignore[arg-type]
            metrics = {"seconds": end - start, "at_limit": self.nbytes / limit}
            if loader:
                # The time the loader would take for the same bytes at the rate it kept.
                metrics["loader"] = self.nbytes / rate_within(log, start, end)
                metrics["floor"] = self.nbytes / max(self.disk - limit, 1.0)
            return Outcome(metrics)

        return run

    def close(self) -> None:
        self._clean()
        shutil.rmtree(self.work, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="the throttled copy of the bandwidth_limit scenario")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--dst", type=Path, required=True)
    p.add_argument("--limit", type=int, required=True)
    a = p.parse_args()
    copy_child(a.src, a.dst, a.limit)
