"""Copy (+ verify) of a POSIX tier to another: PosixStore against `cp` + `sync` and a plain loop.

Every method runs in its own child process (so its peak RSS is its own) on the same cold source
files (their pages are dropped before each run) and writes to an empty destination on the same
file system. Every method is durable when its clock stops (fsync / sync).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.env import ROOT, Env, json_line
from benchmarks.harness import Method, Outcome, Row, Scenario
from tierpoint.config import TierConfig, TierKind
from tierpoint.storage.base import ShardRef, VerifyResult
from tierpoint.storage.checksum import crc32c_update
from tierpoint.storage.posix.store import PosixStore

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


def m_python_loop(src: Path, dst: Path, files: list[str]) -> None:
    (dst / JOB / str(STEP)).mkdir(parents=True)
    for name in files:
        with (
            open(src / JOB / str(STEP) / name, "rb") as i,
            open(dst / JOB / str(STEP) / name, "wb") as o,
        ):
            while chunk := i.read(CHUNK):
                o.write(chunk)
            o.flush()
            os.fsync(o.fileno())


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
    """Verify shard i on a second thread while shard i+1 is copied."""
    a, b = _stores(src, dst)
    pending: list[Future[VerifyResult]] = []
    with ThreadPoolExecutor(1) as verifier:
        for name in files:
            crc = _store_copy(a, b, name)
            ref = ShardRef(JOB, STEP, name)
            pending.append(verifier.submit(b.verify, ref, b.size(ref) or 0, crc))
        for fut in pending:
            _check(fut.result())


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


CP, CP_RB = "cp+sync", "cp+sync, cold read-back crc"
# method -> (function, the baseline it is compared to)
METHODS: dict[str, tuple[Callable[[Path, Path, list[str]], None], str | None]] = {
    CP: (m_cp_sync, None),
    "python read/write+fsync": (m_python_loop, CP),
    "PosixStore copy": (m_store_copy, CP),
    CP_RB: (m_cp_sync_verify, CP),
    "PosixStore copy+verify": (m_store_copy_verify, CP_RB),
    "PosixStore copy+verify pipelined": (m_store_copy_verify_pipelined, CP_RB),
}


def child(method: str, src: Path, dst: Path, files: int) -> None:
    names = shard_names(files)
    t0 = time.perf_counter()
    METHODS[method][0](src, dst, names)
    seconds = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # cp, sync
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    rss = max(me.ru_maxrss, kids.ru_maxrss)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "maxrss_kib": rss}))


class CopyPosix(Scenario):
    name = "copy_posix"
    summary = "POSIX tier to POSIX tier: copy (+ verify) of cold shards, durable at the end"

    def __init__(self, env: Env, mib: int, files: int = 8) -> None:
        self.files = files
        self.total = mib * 1024 * 1024 // files * files
        self.work = env.work / self.name
        self.src, self.dst = self.work / "src", self.work / "dst"

    def params(self) -> dict[str, Any]:
        return {"bytes": self.total, "files": self.files}

    def prepare(self) -> list[Method]:
        make_sources(self.src, self.total, self.files)
        return [
            Method(
                name,
                self._runner(name),
                (Row(name, baseline=base, nbytes=self.total),),
                before=self._reset,
            )
            for name, (_, base) in METHODS.items()
        ]

    def _reset(self) -> None:
        if self.dst.exists():
            shutil.rmtree(self.dst)
        subprocess.run(["sync"], check=True)
        drop_cache(self.src)

    def _runner(self, method: str) -> Callable[[], Outcome]:
        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.copy_posix", method]
            cmd += ["--src", str(self.src), "--dst", str(self.dst), "--files", str(self.files)]
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
