"""Copy (+ verify) throughput of PosixStore against `cp` + `sync` and a plain Python loop.

Run: .venv/bin/python benchmarks/copy_posix.py [--total-mib 1024] [--files 8] [--dir DIR]

Every method runs in its own child process (so its peak RSS is its own) on the same cold source
files (their pages are dropped before each run) and writes to an empty destination on the same
file system. Throughput is bytes copied / wall time, durability included (fsync / sync).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


METHODS: dict[str, Callable[[Path, Path, list[str]], None]] = {
    "cp+sync": m_cp_sync,
    "python read/write+fsync": m_python_loop,
    "PosixStore copy": m_store_copy,
    "cp+sync, cold read-back crc": m_cp_sync_verify,
    "PosixStore copy+verify": m_store_copy_verify,
    "PosixStore copy+verify pipelined": m_store_copy_verify_pipelined,
}


def child(method: str, src: Path, dst: Path, files: int) -> None:
    names = shard_names(files)
    t0 = time.perf_counter()
    METHODS[method](src, dst, names)
    seconds = time.perf_counter() - t0
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # cp, sync
    print(json.dumps({"seconds": seconds, "maxrss_kib": max(self_rss, child_rss)}))


def run(method: str, src: Path, dst: Path, files: int) -> dict[str, float]:
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["sync"], check=True)
    drop_cache(src)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            method,
            "--src",
            str(src),
            "--dst",
            str(dst),
            "--files",
            str(files),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--total-mib", type=int, default=1024)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--repeat", type=int, default=6, help="runs per method; the median counts")
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--src", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--dst", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.src, args.dst, args.files)
        return

    total = args.total_mib * 1024 * 1024 // args.files * args.files
    work = Path(tempfile.mkdtemp(prefix="tierpoint-bench-", dir=args.dir))
    try:
        src, dst = work / "src", work / "dst"
        make_sources(src, total, args.files)
        print(
            f"{total / 2**30:.2f} GiB in {args.files} files, median of {args.repeat} runs, "
            f"source and destination on the same device\n"
        )
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        order = list(METHODS)
        for r in range(args.repeat):
            # Interleaved and rotated, so that drifting load and the after-effects of the
            # previous run (freeing its blocks) hit every method alike.
            for method in order[r % len(order) :] + order[: r % len(order)]:
                runs[method].append(run(method, src, dst, args.files))
        rows = []
        for method, rs in runs.items():
            secs = statistics.median(r["seconds"] for r in rs)
            rss = max(r["maxrss_kib"] for r in rs) / 1024
            rows.append((method, total / secs / 1e6, secs, rss))
        base = rows[0][1]
        base_verify = next(r[1] for r in rows if r[0].startswith("cp+sync, cold"))
        print(f"{'method':36} {'MB/s':>8} {'s':>7} {'x cp':>6} {'x cp+rb':>8} {'peak RSS MiB':>13}")
        for name, mbps, secs, rss in rows:
            print(
                f"{name:36} {mbps:8.0f} {secs:7.2f} {mbps / base:6.2f} "
                f"{mbps / base_verify:8.2f} {rss:13.0f}"
            )
        print(
            "\nx cp: throughput relative to cp+sync; x cp+rb: relative to cp+sync + cold read-back."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
