"""Upload throughput of S3Store (PosixStore source) against raw boto3 `upload_file`.

Run: .venv/bin/python benchmarks/s3_upload.py [--total-mib 1024] [--files 4] [--part-mib 16]
     [--concurrency 2] [--endpoint-url URL]

Without --endpoint-url the script starts its own moto S3 server on 127.0.0.1 and stops it at the
end. moto is single-threaded and costs per request, so absolute numbers say more about moto than
about us: compare the two methods of the same run. Both use the same part size and concurrency;
each method runs in its own child process so that peak RSS is its own.
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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3
from boto3.s3.transfer import TransferConfig

from tierpoint.config import TierConfig, TierKind
from tierpoint.devstack.services import MotoS3Server
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


METHODS: dict[str, Callable[[Path, str, str, int, int, int], None]] = {
    "boto3 upload_file": m_boto3,
    "S3Store write+verify": m_store,
}


def child(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    METHODS[args.child](
        args.src, args.endpoint_url, args.bucket, args.files, args.part_mib * MiB, args.concurrency
    )
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "maxrss_kib": rss}))


def empty_bucket(client: Any, bucket: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--total-mib", type=int, default=1024)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--part-mib", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="runs per method; the median counts")
    p.add_argument("--endpoint-url", default=None)
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--src", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--bucket", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return

    moto: MotoS3Server | None = None
    if args.endpoint_url is None:
        moto = MotoS3Server()
        args.endpoint_url = moto.start()
        os.environ["AWS_ACCESS_KEY_ID"] = moto.access_key_id
        os.environ["AWS_SECRET_ACCESS_KEY"] = moto.secret_access_key
    work = Path(tempfile.mkdtemp(prefix="tierpoint-s3bench-", dir=args.dir))
    try:
        client = boto3.client("s3", endpoint_url=args.endpoint_url, region_name=REGION)
        bucket = f"tp-bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        total = args.total_mib * MiB // args.files * args.files
        make_sources(work, total, args.files)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method in METHODS:
                empty_bucket(client, bucket)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        method,
                        "--src",
                        str(work),
                        "--endpoint-url",
                        args.endpoint_url,
                        "--bucket",
                        bucket,
                        "--files",
                        str(args.files),
                        "--part-mib",
                        str(args.part_mib),
                        "--concurrency",
                        str(args.concurrency),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=os.environ,
                ).stdout
                runs[method].append(json.loads(out.strip().splitlines()[-1]))
        empty_bucket(client, bucket)
        client.delete_bucket(Bucket=bucket)
        print(
            f"{total / 2**30:.2f} GiB in {args.files} files to {args.endpoint_url}"
            f"{' (moto, started here)' if moto else ''}; part {args.part_mib} MiB, "
            f"concurrency {args.concurrency}, median of {args.repeat} runs\n"
        )
        rows = []
        for method, rs in runs.items():
            secs = statistics.median(r["seconds"] for r in rs)
            rows.append((method, total / secs / 1e6, secs, max(r["maxrss_kib"] for r in rs) / 1024))
        base = rows[0][1]
        print(f"{'method':24} {'MB/s':>8} {'s':>7} {'x boto3':>8} {'peak RSS MiB':>13}")
        for name, mbps, secs, rss in rows:
            print(f"{name:24} {mbps:8.0f} {secs:7.2f} {mbps / base:8.2f} {rss:13.0f}")
        print("\nx boto3: throughput relative to boto3 upload_file on the same endpoint.")
        print("S3Store write+verify includes the CRC32C per part, the FULL_OBJECT completion")
        print("check and a HEAD per object comparing S3's stored CRC32C.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if moto is not None:
            moto.stop()


if __name__ == "__main__":
    main()
