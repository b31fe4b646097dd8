"""S3 as it behaves at scale: S3Store's upload+verify and a read-back of every shard, through the
S3-shaping proxy (tests/helpers/s3_proxy.py: 20-50 ms per request, 90 MB/s per connection, 503
SlowDown above a request rate per prefix or during a storm) in front of the benchmark's moto,
with botocore's `standard` and `adaptive` retry modes; the same work straight to moto is the
baseline.

S3 promises 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per partitioned
prefix. moto on one shared machine answers a few hundred a second, so the proxy's limits are S3's
divided by SCALE: the same ratio of writes to reads, and a limit this machine reaches with a
few threads, as a thousand nodes reach S3's. Every shard of a run is under one prefix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3

from benchmarks.env import ROOT, Env, json_line, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.s3_shaping_child import JOB, REGION, STEP, names
from benchmarks.scenarios.s3_upload import empty_bucket
from tests.helpers.s3_proxy import Shaping, ShapingProxy

SCALE = 175
LIMITED = Shaping(write_rate=3500 // SCALE, read_rate=5500 // SCALE)
# Only the storm refuses requests: no rate limit, so what it costs is the storm's alone.
STORMY = Shaping(write_rate=0, read_rate=0)
STORM_FRACTION = 0.5
ATTEMPTS = 6  # the tier's default max_attempts


def make_sources(root: Path, files: int, size: int) -> None:
    d = root / JOB / str(STEP)
    d.mkdir(parents=True)
    for name in names(files):
        (d / name).write_bytes(os.urandom(size))


class S3Shaping(Scenario):
    name = "s3_shaping"
    summary = "S3Store upload+verify, read-back via an S3-shaping proxy: standard vs adaptive"

    def __init__(
        self,
        env: Env,
        files: int,
        size: int,
        threads: int,
        storm: float,
        only: Sequence[str] | None = None,
    ) -> None:
        self.env = env
        self.only = only
        self.files, self.size, self.threads, self.storm = files, size, threads, storm
        self.work = env.work / self.name
        self.bucket = f"tp-bench-{uuid.uuid4().hex[:8]}"
        self.proxies: dict[str, ShapingProxy] = {}

    def params(self) -> dict[str, Any]:
        return {
            "shards": f"{self.files} x {self.size // 1024} KiB",
            "threads": self.threads,
            "attempts": ATTEMPTS,
            "limited": f"{LIMITED.write_rate} writes/s, {LIMITED.read_rate} reads/s per prefix "
            f"(S3's / {SCALE}), {LIMITED.latency_min * 1000:.0f}-{LIMITED.latency_max * 1000:.0f} "
            f"ms, {LIMITED.bandwidth / 1e6:.0f} MB/s per connection",
            "storm": f"SlowDown to {STORM_FRACTION:.0%} of requests for {self.storm:g} s from the "
            "first upload, no rate limit",
        }

    def watched(self) -> Watched:
        out = {name: (p.pid, False) for name, p in self.proxies.items() if p.pid}
        moto = self.env.moto()
        if moto.pid:
            out["moto"] = (moto.pid, False)
        return out

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
        make_sources(self.work, self.files, self.size)
        for name, shaping in (("limited", LIMITED), ("storm", STORMY)):
            self.proxies[name] = ShapingProxy(moto.endpoint_url, shaping)
            self.proxies[name].start()
        storm_url = (
            f"{self.proxies['storm'].endpoint_url}/_shaping/storm?"
            f"fraction={STORM_FRACTION}&seconds={self.storm}"
        )
        cases: list[tuple[str, str, str, str | None]] = [
            ("direct", moto.endpoint_url, "standard", None)
        ]
        for proxy in ("limited", "storm"):
            for mode in ("standard", "adaptive"):
                url = self.proxies[proxy].endpoint_url
                cases.append(
                    (f"{proxy}, {mode}", url, mode, storm_url if proxy == "storm" else None)
                )
        return [self._method(*c) for c in cases if self.only is None or c[0] in self.only]

    def _method(self, name: str, url: str, mode: str, storm_url: str | None) -> Method:
        total = self.files * self.size
        direct = name == "direct"
        rows = (
            Row(
                f"{name}: upload+verify",
                "upload",
                None if direct else "direct: upload+verify",
                nbytes=total,
            ),
            Row(
                f"{name}: read back", "read", None if direct else "direct: read back", nbytes=total
            ),
            # Counts have no baseline: the direct run's are 0, and so may a mode's be.
            Row(f"{name}: retries", "retries", unit="n"),
            Row(f"{name}: given up", "gave_up", unit="n"),
        )
        return Method(
            name,
            self._runner(url, mode, storm_url),
            rows,
            # moto keeps objects in memory: each run starts from an empty bucket.
            before=lambda: empty_bucket(self.client, self.bucket),
        )

    def _runner(self, url: str, mode: str, storm_url: str | None) -> Callable[[], Outcome]:
        def run() -> Outcome:
            cmd = [sys.executable, "-m", "benchmarks.scenarios.s3_shaping_child"]
            cmd += ["--src", str(self.work), "--endpoint-url", url, "--bucket", self.bucket]
            cmd += ["--files", str(self.files), "--threads", str(self.threads)]
            cmd += ["--mode", mode, "--attempts", str(ATTEMPTS)]
            if storm_url:
                cmd += ["--storm-url", storm_url]
            out = subprocess.run(
                cmd,
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=subprocess_env(self.creds),
            )
            r: dict[str, Any] = json_line(out.stdout)
            return Outcome({k: float(r[k]) for k in ("upload", "read", "retries", "gave_up")})

        return run

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        if hasattr(self, "client"):
            empty_bucket(self.client, self.bucket)
            self.client.delete_bucket(Bucket=self.bucket)
        shutil.rmtree(self.work, ignore_errors=True)
