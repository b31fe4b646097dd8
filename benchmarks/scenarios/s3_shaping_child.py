"""One run of one s3_shaping method, in a process of its own (a fresh botocore client: adaptive
mode's rate estimate starts from nothing each run): shards written and verified through S3Store,
as the s3 stage of a lifecycle does, then read back whole, as a restore does, by `threads` at
once. A request botocore gives up on is tried again after a second, as Temporal retries a copy
attempt, and counted."""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import open_store
from tierpoint.storage.s3.layout import FLAT
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import RetryMode, TierConfig, TierKind

JOB, STEP = "bench", 1
REGION = "us-east-1"
# Before the next try of what botocore gave up on: Temporal's first retry interval.
GIVE_UP_BACKOFF = 1.0


def names(files: int) -> list[str]:
    return [f"shard-{i:04d}.bin" for i in range(files)]


class Counts:
    def __init__(self) -> None:
        self.calls = self.attempts = self.gave_up = 0
        self._lock = threading.Lock()

    def hook(self, s3: S3Store) -> None:
        # One before-call per API call, one before-send per HTTP attempt of it.
        events = s3.client.meta.events
        events.register("before-call.s3", lambda **_: self._add("calls"))
        events.register("before-send.s3", lambda **_: self._add("attempts"))

    def _add(self, what: str) -> None:
        with self._lock:  # botocore sends from every thread of the pool
            setattr(self, what, getattr(self, what) + 1)

    def until_done(self, fn: Callable[[], Any]) -> None:
        while True:
            try:
                fn()
                return
            except ClientError as e:
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status != 503:
                    raise
                self._add("gave_up")
                time.sleep(GIVE_UP_BACKOFF)


def run(a: argparse.Namespace) -> dict[str, Any]:
    local = PosixStore(TierConfig(name="ssd", kind=TierKind.SHARED, root=str(a.src)))
    tier = TierConfig(
        name="s3",
        kind=TierKind.S3,
        bucket=a.bucket,
        endpoint_url=a.endpoint_url,
        region=REGION,
        retry_mode=RetryMode(a.mode),
        max_attempts=a.attempts,
    )
    s3 = open_store(tier, None, FLAT)
    assert isinstance(s3, S3Store)
    counts = Counts()
    counts.hook(s3)

    def upload(name: str) -> None:
        ref = ShardRef(JOB, STEP, name)
        size = local.size(ref)
        assert size is not None

        def once() -> None:
            with local.open_read(ref) as f:
                result = s3.write(ref, f, size, None, None)
            check = s3.verify(ref, size, result.crc32c)
            if not check.ok:
                raise SystemExit(f"verification failed: {check.reason}")

        counts.until_done(once)

    def read(name: str) -> None:
        def once() -> None:
            if not s3.checksum(ShardRef(JOB, STEP, name)).ok:
                raise SystemExit(f"{name} is missing")

        counts.until_done(once)

    out: dict[str, Any] = {}
    if a.storm_url:  # the shaping proxy's storm, from the first upload on
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(urllib.request.Request(a.storm_url, method="POST"), timeout=10).close()
    with ThreadPoolExecutor(a.threads) as pool:
        for what, fn in (("upload", upload), ("read", read)):
            t0 = time.perf_counter()
            list(pool.map(fn, names(a.files)))
            out[what] = time.perf_counter() - t0
    out.update(calls=counts.calls, retries=counts.attempts - counts.calls, gave_up=counts.gave_up)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description="one method of the s3_shaping scenario")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--endpoint-url", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--files", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--mode", choices=("standard", "adaptive"), required=True)
    p.add_argument("--attempts", type=int, required=True)
    p.add_argument("--storm-url", help="POSTed to before the uploads begin")
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()
