"""Upload of a POSIX tier's shards to S3: S3Store write + verify against raw boto3 `upload_file`,
swept over part size x concurrency.

Both run against the benchmark's own moto server on 127.0.0.1, cell by cell with the same part
size and concurrency, each run in its own child process (`s3_upload_child`, so its peak RSS is its
own). Besides each cell's ratio to boto3 in the same cell, the caption compares every S3Store cell
with the best boto3 cell of the run (what a user tuning `TransferConfig` for this endpoint would
pick). moto is single-threaded and costs per request: compare the methods of the same run, not
the absolute numbers.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3

from benchmarks.env import ROOT, Env, json_line, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.s3_upload_child import JOB, REGION, STEP, names

MiB = 1024 * 1024
Cell = tuple[int, int]  # (part MiB, concurrency)
FULL_CELLS: tuple[Cell, ...] = tuple((p, c) for p in (8, 16, 32, 64) for c in (1, 2, 4))
QUICK_CELLS: tuple[Cell, ...] = ((8, 1), (8, 2))


def make_sources(root: Path, total: int, files: int) -> None:
    d = root / JOB / str(STEP)
    d.mkdir(parents=True)
    per = total // files
    block = os.urandom(8 * MiB)
    for name in names(files):
        with open(d / name, "wb") as f:
            left = per
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n


def empty_bucket(client: Any, bucket: str, prefix: str = "") -> None:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def label(method: str, cell: Cell) -> str:
    what = "boto3 upload_file" if method == "boto3" else "S3Store write+verify"
    return f"{what} {cell[0]} MiB x{cell[1]}"


class S3Upload(Scenario):
    name = "s3_upload"
    summary = "POSIX tier to S3 (moto): S3Store write+verify vs boto3 upload_file, part x conc"

    def __init__(self, env: Env, mib: int, files: int, cells: Sequence[Cell]) -> None:
        self.env = env
        self.files, self.cells = files, tuple(cells)
        self.total = mib * MiB // files * files
        self.work = env.work / self.name
        self.bucket = f"tp-bench-{uuid.uuid4().hex[:8]}"
        self.seconds: dict[str, list[float]] = {}

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": self.total, "files": self.files}
        boto = {c: self.seconds.get(label("boto3", c)) for c in self.cells}
        timed = {c: statistics.median(v) for c, v in boto.items() if v}
        if timed:
            best = min(timed, key=lambda c: timed[c])
            out["best boto3 cell"] = f"{best[0]} MiB x{best[1]}"
            vs_best = {
                c: statistics.median(v) / timed[best]
                for c in self.cells
                if (v := self.seconds.get(label("store", c)))
            }
            if vs_best:
                worst = max(vs_best, key=lambda c: vs_best[c])
                out["S3Store vs best boto3 (time ratio)"] = (
                    f"{min(vs_best.values()):.2f}-{vs_best[worst]:.2f}, "
                    f"worst at {worst[0]} MiB x{worst[1]}"
                )
        return out

    def watched(self) -> Watched:
        moto = self.env.moto()
        return {"moto": (moto.pid, False)} if moto.pid else {}

    def prepare(self) -> list[Method]:
        moto = self.env.moto()
        self.creds = {
            "AWS_ACCESS_KEY_ID": moto.access_key_id,
            "AWS_SECRET_ACCESS_KEY": moto.secret_access_key,
        }
        self.client = boto3.client(
            "s3",
            endpoint_url=moto.endpoint_url,
            region_name=REGION,
            aws_access_key_id=moto.access_key_id,
            aws_secret_access_key=moto.secret_access_key,
        )
        self.client.create_bucket(Bucket=self.bucket)
        make_sources(self.work, self.total, self.files)
        methods = []
        for cell in self.cells:
            base = label("boto3", cell)
            for method in ("boto3", "store"):
                name = label(method, cell)
                compared = None if method == "boto3" else base
                rss_base = None if method == "boto3" else f"{base}: peak RSS"
                rows = (
                    Row(name, baseline=compared, nbytes=self.total),
                    Row(f"{name}: peak RSS", metric="rss_mib", baseline=rss_base, unit="MiB"),
                )
                methods.append(
                    Method(
                        name,
                        self._runner(method, name, cell),
                        rows,
                        # moto keeps objects in memory: each run starts from an empty bucket.
                        before=lambda: empty_bucket(self.client, self.bucket),
                    )
                )
        return methods

    def _runner(self, method: str, name: str, cell: Cell) -> Callable[[], Outcome]:
        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.s3_upload_child", method]
            cmd += ["--src", str(self.work), "--endpoint-url", self.env.moto().endpoint_url]
            cmd += ["--bucket", self.bucket, "--files", str(self.files)]
            cmd += ["--part", str(cell[0] * MiB), "--concurrency", str(cell[1])]
            out = subprocess.run(
                cmd,
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=subprocess_env(self.creds),
            )
            r: dict[str, Any] = json_line(out.stdout)
            seconds, rss = float(r["seconds"]), float(r["maxrss_kib"]) / 1024
            self.seconds.setdefault(name, []).append(seconds)
            return Outcome(
                {"seconds": seconds, "rss_mib": rss}, cpu={"bench": float(r["cpu"])}, rss_mib=rss
            )

        return run

    def close(self) -> None:
        if hasattr(self, "client"):
            empty_bucket(self.client, self.bucket)
            self.client.delete_bucket(Bucket=self.bucket)
        shutil.rmtree(self.work, ignore_errors=True)
