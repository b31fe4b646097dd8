"""Copy (+ verify) of a POSIX tier to another: PosixStore against `cp` + `sync`, in two shapes of
the same bytes (one big shard; many small ones).

Every method runs in its own child process (so its peak RSS is its own) on the same cold source
files (their pages are dropped before each run) and writes to an empty destination on the same
file system. Every method is durable when its clock stops (fsync / sync).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.env import ROOT, Env, json_line
from benchmarks.harness import Method, Outcome, Row, Scenario
from tierpoint.storage.base import ShardRef, VerifyResult
from tierpoint.storage.checksum import crc32c_update
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig, TierKind

JOB, STEP = "bench", 1
CHUNK = 8 * 1024 * 1024


def shard_names(files: int) -> list[str]:
    return [f"shard-{i:03d}.bin" for i in range(files)]


def make_sources(src_root: Path, total: int, files: int) -> None:
    d = src_root / JOB / str(STEP)
    d.mkdir(parents=True, exist_ok=True)
    per = total // files
    block = os.urandom(CHUNK)
    for name in shard_names(files):
        with open(d / name, "wb") as f:
            left = per
            while left:
                n = min(left, CHUNK)
                f.write(block[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())


def drop_cache(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cold_crc(path: Path) -> int:
    """A plain cold read-back: the baseline's verification."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = memoryview(bytearray(CHUNK))
        crc = 0
        while n := os.readv(fd, [buf]):
            crc = crc32c_update(crc, buf[:n])
        return crc
    finally:
        os.close(fd)


# -- methods (run in a child process) ------------------------------------------------------


def _stores(src: Path, dst: Path) -> tuple[PosixStore, PosixStore]:
    return (
        PosixStore(TierConfig(name="src", kind=TierKind.SHARED, root=str(src))),
        PosixStore(TierConfig(name="dst", kind=TierKind.SHARED, root=str(dst))),
    )


def _store_copy(a: PosixStore, b: PosixStore, name: str) -> str:
    ref = ShardRef(JOB, STEP, name)
    size = a.size(ref)
    assert size is not None
    with a.open_read(ref) as f:
        return b.write(ref, f, size, None, None).crc32c


def _check(v: VerifyResult) -> None:
    if not v.ok:
        raise SystemExit(f"verification failed: {v.reason}")


def m_store_copy(src: Path, dst: Path, files: list[str]) -> None:
    a, b = _stores(src, dst)
    for name in files:
        _store_copy(a, b, name)


def m_store_copy_verify(src: Path, dst: Path, files: list[str]) -> None:
    a, b = _stores(src, dst)
    for name in files:
        crc = _store_copy(a, b, name)
        ref = ShardRef(JOB, STEP, name)
        _check(b.verify(ref, b.size(ref) or 0, crc))


def m_store_copy_verify_pipelined(src: Path, dst: Path, files: list[str]) -> None:
    """As the batch copy activity does: the read-back of shard i on a second thread while shard
    i+1 is copied, one shard deep."""
    a, b = _stores(src, dst)
    pending: Future[VerifyResult] | None = None
    with ThreadPoolExecutor(1) as verifier:
        for name in files:
            crc = _store_copy(a, b, name)
            if pending is not None:
                _check(pending.result())
            ref = ShardRef(JOB, STEP, name)
            pending = verifier.submit(b.verify, ref, b.size(ref) or 0, crc)
        if pending is not None:
            _check(pending.result())


def m_cp_sync_verify(src: Path, dst: Path, files: list[str]) -> None:
    m_cp_sync(src, dst, files)
    for name in files:
        cold_crc(dst / JOB / str(STEP) / name)


def m_cp_sync(src: Path, dst: Path, files: list[str]) -> None:
    (dst / JOB).mkdir(parents=True)
    subprocess.run(["cp", "-r", str(src / JOB / str(STEP)), str(dst / JOB)], check=True)
    # fsync exactly the copied files (and their directory), as the store does; a bare `sync`
    # would also flush whatever else is dirty on the machine.
    d = dst / JOB / str(STEP)
    subprocess.run(["sync", str(d), *(str(d / n) for n in files)], check=True)


CP, CP_RB = "cp+sync", "cp+sync+cold read-back"
COPY, VERIFY, PIPELINED = (
    "PosixStore copy",
    "PosixStore copy+verify",
    "PosixStore copy+verify pipelined",
)
METHODS: dict[str, Callable[[Path, Path, list[str]], None]] = {
    CP: m_cp_sync,
    CP_RB: m_cp_sync_verify,
    COPY: m_store_copy,
    VERIFY: m_store_copy_verify,
    PIPELINED: m_store_copy_verify_pipelined,
}
# method -> its rows' baselines: every copy against `cp` + `sync` (the target: a time ratio of
# at most 1.18, i.e. 0.85x its throughput), the verified ones also against cp + a cold read-back.
BASELINES: dict[str, tuple[str | None, ...]] = {
    CP: (None,),
    CP_RB: (CP,),
    COPY: (CP,),
    VERIFY: (CP, CP_RB),
    PIPELINED: (CP, CP_RB),
}


def child(method: str, src: Path, dst: Path, files: int) -> None:
    names = shard_names(files)
    t0 = time.perf_counter()
    METHODS[method](src, dst, names)
    seconds = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # cp, sync
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    rss = max(me.ru_maxrss, kids.ru_maxrss)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "maxrss_kib": rss}))


@dataclass(frozen=True)
class Shape:
    files: int
    file_bytes: int

    @property
    def label(self) -> str:
        return f"{self.files} x {_mib(self.file_bytes)}"

    @property
    def total(self) -> int:
        return self.files * self.file_bytes


def _mib(n: int) -> str:
    return f"{n / 1024**3:g} GiB" if n >= 1024**3 else f"{n / 1024**2:g} MiB"


def _row_label(shape: Shape, method: str, baseline: str | None, first: bool) -> str:
    label = f"{shape.label}: {method}"
    return label if first or baseline is None else f"{label} (vs {baseline})"


class CopyPosix(Scenario):
    name = "copy_posix"
    summary = "POSIX tier to POSIX tier: copy (+ verify) of cold shards, durable at the end"

    def __init__(self, env: Env, mib: int, small_mib: int) -> None:
        total = mib * 1024 * 1024
        small = small_mib * 1024 * 1024
        # One big shard, and the same bytes in small ones.
        self.shapes = (Shape(1, total), Shape(max(1, total // small), small))
        self.work = env.work / self.name

    def params(self) -> dict[str, Any]:
        return {"shapes": [s.label for s in self.shapes]}

    def _dirs(self, shape: Shape) -> tuple[Path, Path]:
        base = self.work / f"{shape.files}x{shape.file_bytes}"
        return base / "src", base / "dst"

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True, exist_ok=True)
        # Each shape's source plus one destination at a time, with room to spare.
        need = 2 * sum(s.total for s in self.shapes)
        free = shutil.disk_usage(self.work).free
        if free < need:
            raise SystemExit(
                f"copy_posix needs {need / 1e9:.1f} GB free under {self.work}, has {free / 1e9:.1f}"
            )
        methods = []
        for shape in self.shapes:
            src, _ = self._dirs(shape)
            make_sources(src, shape.total, shape.files)
            for name, bases in BASELINES.items():
                rows = tuple(
                    Row(
                        _row_label(shape, name, base, i == 0),
                        baseline=None if base is None else f"{shape.label}: {base}",
                        nbytes=shape.total,
                    )
                    for i, base in enumerate(bases)
                )
                methods.append(
                    Method(
                        f"{shape.label}: {name}",
                        self._runner(name, shape),
                        rows,
                        before=functools.partial(self._reset, shape),
                    )
                )
        return methods

    def _reset(self, shape: Shape) -> None:
        src, dst = self._dirs(shape)
        if dst.exists():
            shutil.rmtree(dst)
        subprocess.run(["sync"], check=True)
        drop_cache(src)

    def _runner(self, method: str, shape: Shape) -> Callable[[], Outcome]:
        src, dst = self._dirs(shape)

        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.copy_posix", method]
            cmd += ["--src", str(src), "--dst", str(dst), "--files", str(shape.files)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            r: dict[str, Any] = json_line(out.stdout)
            return Outcome(
                {"seconds": float(r["seconds"])},
                cpu={"bench": float(r["cpu"])},
                rss_mib=float(r["maxrss_kib"]) / 1024,
            )

        return run

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one method of the copy_posix scenario")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--dst", type=Path, required=True)
    p.add_argument("--files", type=int, required=True)
    a = p.parse_args()
    child(a.method, a.src, a.dst, a.files)
