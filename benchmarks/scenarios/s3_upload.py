"""Upload of a POSIX tier's shards to S3: S3Store write + verify against raw boto3 `upload_file`.

Both run against the benchmark's own moto server on 127.0.0.1 with the same part size and
concurrency, each in its own child process (so its peak RSS is its own). moto is single-threaded
and costs per request: compare the methods of the same run, not the absolute numbers.
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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig

from benchmarks.env import ROOT, Env, json_line, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from tierpoint.config import TierConfig, TierKind
from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import open_store
from tierpoint.storage.s3.store import S3Store

JOB, STEP = "bench", 1
MiB = 1024 * 1024
REGION = "us-east-1"


def names(files: int) -> list[str]:
    return [f"shard-{i:03d}.bin" for i in range(files)]


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


def s3_tier(endpoint: str, bucket: str, part: int, concurrency: int) -> TierConfig:
    return TierConfig(
        name="s3",
        kind=TierKind.S3,
        bucket=bucket,
        endpoint_url=endpoint,
        region=REGION,
        multipart_part_size=part,
        multipart_concurrency=concurrency,
    )


def m_store(src: Path, endpoint: str, bucket: str, files: int, part: int, conc: int) -> None:
    local = PosixStore(TierConfig(name="ssd", kind=TierKind.SHARED, root=str(src)))
    s3 = open_store(s3_tier(endpoint, bucket, part, conc), None)
    assert isinstance(s3, S3Store)
    for name in names(files):
        ref = ShardRef(JOB, STEP, name)
        size = local.size(ref)
        assert size is not None
        with local.open_read(ref) as f:
            result = s3.write(ref, f, size, None, None)
        check = s3.verify(ref, size, result.crc32c)
        if not check.ok:
            raise SystemExit(f"verification failed: {check.reason}")


def m_boto3(src: Path, endpoint: str, bucket: str, files: int, part: int, conc: int) -> None:
    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    config = TransferConfig(
        multipart_threshold=part, multipart_chunksize=part, max_concurrency=conc, use_threads=True
    )
    for name in names(files):
        client.upload_file(str(src / JOB / str(STEP) / name), bucket, f"raw/{name}", Config=config)


BOTO3 = "boto3 upload_file"
METHODS: dict[str, tuple[Callable[[Path, str, str, int, int, int], None], str | None]] = {
    BOTO3: (m_boto3, None),
    # The CRC32C per part, the FULL_OBJECT completion check and a HEAD comparing S3's CRC32C.
    "S3Store write+verify": (m_store, BOTO3),
}


def empty_bucket(client: Any, bucket: str, prefix: str = "") -> None:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


class S3Upload(Scenario):
    name = "s3_upload"
    summary = "POSIX tier to S3 (moto): S3Store write+verify vs boto3 upload_file"

    def __init__(self, env: Env, mib: int, files: int = 4, part_mib: int = 16, conc: int = 2):
        self.env = env
        self.files, self.part, self.conc = files, part_mib * MiB, conc
        self.total = mib * MiB // files * files
        self.work = env.work / self.name
        self.bucket = f"tp-bench-{uuid.uuid4().hex[:8]}"

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.total,
            "files": self.files,
            "part_mib": self.part // MiB,
            "concurrency": self.conc,
        }

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
        return [
            Method(
                name,
                self._runner(name),
                (Row(name, baseline=base, nbytes=self.total),),
                # moto keeps objects in memory: each run starts from an empty bucket.
                before=lambda: empty_bucket(self.client, self.bucket),
            )
            for name, (_, base) in METHODS.items()
        ]

    def _runner(self, method: str) -> Callable[[], Outcome]:
        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.s3_upload", method]
            cmd += ["--src", str(self.work), "--endpoint-url", self.env.moto().endpoint_url]
            cmd += ["--bucket", self.bucket, "--files", str(self.files)]
            cmd += ["--part", str(self.part), "--concurrency", str(self.conc)]
            out = subprocess.run(
                cmd,
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=subprocess_env(self.creds),
            )
            r: dict[str, Any] = json_line(out.stdout)
            return Outcome(
                {"seconds": float(r["seconds"])},
                cpu={"bench": float(r["cpu"])},
                rss_mib=float(r["maxrss_kib"]) / 1024,
            )

        return run

    def close(self) -> None:
        if hasattr(self, "client"):
            empty_bucket(self.client, self.bucket)
            self.client.delete_bucket(Bucket=self.bucket)
        shutil.rmtree(self.work, ignore_errors=True)


def child(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    METHODS[a.method][0](a.src, a.endpoint_url, a.bucket, a.files, a.part, a.concurrency)
    seconds = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = me.ru_utime + me.ru_stime
    print(json.dumps({"seconds": seconds, "cpu": cpu, "maxrss_kib": me.ru_maxrss}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one method of the s3_upload scenario")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--endpoint-url", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--files", type=int, required=True)
    p.add_argument("--part", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    child(p.parse_args())
