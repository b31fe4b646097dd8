"""One run of one s3_upload method, in a process of its own: its peak RSS is the method's own.

Only boto3 is imported up front, so the baseline's RSS is boto3's and not also tierpoint's (the
S3Store method imports tierpoint when it runs, and pays for it in its RSS).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig

JOB, STEP = "bench", 1
REGION = "us-east-1"


def names(files: int) -> list[str]:
    return [f"shard-{i:03d}.bin" for i in range(files)]


def m_store(src: Path, endpoint: str, bucket: str, files: int, part: int, conc: int) -> None:
    from tierpoint.storage.base import ShardRef
    from tierpoint.storage.posix.store import PosixStore
    from tierpoint.storage.registry import open_store
    from tierpoint.storage.s3.layout import FLAT
    from tierpoint.storage.s3.store import S3Store
    from tierpoint.tier_config import TierConfig, TierKind

    local = PosixStore(TierConfig(name="ssd", kind=TierKind.SHARED, root=str(src)))
    tier = TierConfig(
        name="s3",
        kind=TierKind.S3,
        bucket=bucket,
        endpoint_url=endpoint,
        region=REGION,
        multipart_part_size=part,
        multipart_concurrency=conc,
    )
    s3 = open_store(tier, None, FLAT)
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
    "boto3": m_boto3,
    # The CRC32C per part, the FULL_OBJECT completion check and a HEAD comparing S3's CRC32C.
    "store": m_store,
}


def main() -> None:
    p = argparse.ArgumentParser(description="one method of the s3_upload scenario")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--endpoint-url", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--files", type=int, required=True)
    p.add_argument("--part", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    a = p.parse_args()
    if a.method == "store":
        # Imported before the clock starts: the RSS counts tierpoint, the time does not.
        import tierpoint.storage.registry  # noqa: F401
    t0 = time.perf_counter()
    METHODS[a.method](a.src, a.endpoint_url, a.bucket, a.files, a.part, a.concurrency)
    seconds = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = me.ru_utime + me.ru_stime
    print(json.dumps({"seconds": seconds, "cpu": cpu, "maxrss_kib": me.ru_maxrss}))


if __name__ == "__main__":
    main()
