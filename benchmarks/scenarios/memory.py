"""Peak memory of the workers moving one large shard: a node worker (`tierpoint worker --node N
--no-shared`) sealing it and copying it to the shared tier, and the shared worker (`tierpoint
worker --no-node`, the default) uploading it to S3, each a real process of its own.

The scenario starts what they need itself: an embedded Postgres with the migrations, a Temporal
dev server, a moto of its own (the S3 tier), `tierpoint api`, and the two workers. One shard
(4 GiB, 4x the data scenarios' size; 64 MiB in quick) is written once next to the node's local
tier and hard-linked into each run's step there, registered through the API, and followed until
it is restorable on S3. Each process's peak RSS is its VmHWM (/proc/PID/status), reset before the
run through /proc/PID/clear_refs, and at least the highest VmRSS sampled every 50 ms; it is
compared to the same process's RSS just before the run (idle, after earlier runs). After each run
the shared and S3 copies are removed and the local pages dropped, and before each run the
scenario's own moto is restarted (moto keeps objects in memory, a large one several times over).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

import boto3
import crc32c
from sqlalchemy.orm import Session
from tierpoint_client import Client
from tierpoint_client.models import ShardSpec

from apps.devstack.services import (
    EmbeddedPostgres,
    MotoS3Server,
    TemporalDevServer,
    free_port,
)
from benchmarks.env import Env, tierpoint_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.s3_upload import empty_bucket
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.token import tokens

MiB = 1024 * 1024
NODE = "node-m"
SHARD = "model.bin"
START_TIMEOUT = 120.0
WAIT = 1800.0  # hang guard: 4 GiB through moto takes about a minute on a quiet machine
WORKERS = ("node worker", "shared worker")
# moto holds an object being completed several times over (its parts, the joined object): a
# floor for the RAM a run needs, not a measurement of it.
MOTO_OVERHEAD = 3


def status_meminfo(field: str) -> int:
    """A /proc/meminfo field, KiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/meminfo has no {field}")


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0, our own children)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class Sampler:
    """The highest VmRSS of each process, every 50 ms, while a run lasts."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = {k: 0 for k in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for k, pid in self.pids.items():
                with suppress(OSError, RuntimeError):
                    self.peak[k] = max(self.peak[k], status_kib(pid, "VmRSS"))


class Memory(Scenario):
    name = "memory"
    summary = "peak RSS of a node worker copying one large shard and the shared worker uploading it"

    def __init__(self, env: Env, mib: int) -> None:
        self.env = env
        self.size = mib * MiB
        self.work = env.work / self.name
        self.job = f"bench-{uuid.uuid4().hex[:8]}"
        self.step = 0
        self.bucket = f"tp-mem-{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        # A moto of its own, restarted before every run: moto holds a large object several times
        # over while it completes a multipart upload and does not give all of it back when the
        # object is deleted (a second 4 GiB run took it to 17 GiB and the OOM killer).
        self.moto = MotoS3Server()

    def params(self) -> dict[str, Any]:
        return {"shard_bytes": self.size, "node": NODE}

    def watched(self) -> Watched:
        found = {k: (p.pid, False) for k, p in self.procs.items()}
        if self.moto.pid:
            found["moto"] = (self.moto.pid, False)
        return found

    def prepare(self) -> list[Method]:
        need = MOTO_OVERHEAD * self.size
        if (avail := status_meminfo("MemAvailable") * 1024) < need:
            raise RuntimeError(
                f"memory: a {self.size / 2**30:.1f} GiB shard needs ~{need / 2**30:.0f} GiB of "
                f"RAM for moto, {avail / 2**30:.1f} GiB available; run it with a smaller --mib"
            )
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        url = self.pg.start()
        self.temporal = TemporalDevServer(self.work / "temporal.db")
        temporal = self.temporal.start(log_file=self.work / "temporal.log")
        migrate.upgrade(url)
        engine = make_sync_engine(url, pool_size=1)
        with Session(engine) as s:
            upsert_node(s, NODE, {})
            token = tokens.create_token(s, self.job, ["train:bench-"], None).secret
            s.commit()
        engine.dispose()
        moto = self.moto
        moto.start(log_file=self.work / "moto.log")
        self.s3 = boto3.client(
            "s3",
            endpoint_url=moto.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=moto.access_key_id,
            aws_secret_access_key=moto.secret_access_key,
        )
        self.s3.create_bucket(Bucket=self.bucket)
        self.nodes = self.work / "nodes"
        self.shared = self.work / "lustre"
        tiers = [
            {"name": "ssd", "kind": "local", "root": str(self.nodes / "{node}")},
            {"name": "lustre", "kind": "shared", "root": str(self.shared)},
            {
                "name": "s3",
                "kind": "s3",
                "bucket": self.bucket,
                "endpoint_url": moto.endpoint_url,
                "region": "us-east-1",
            },
        ]
        env = tierpoint_env(
            self.work,
            url,
            temporal,
            tiers,
            {
                "AWS_ACCESS_KEY_ID": moto.access_key_id,
                "AWS_SECRET_ACCESS_KEY": moto.secret_access_key,
            },
        )
        port = free_port()
        tierpoint = str(Path(sys.executable).with_name("tierpoint"))
        self._start("api", [tierpoint, "api", "--host", "127.0.0.1", "--port", str(port)], env)
        self._start("node worker", [tierpoint, "worker", "--node", NODE, "--no-shared"], env)
        self._start("shared worker", [tierpoint, "worker"], env)
        self.client = Client(f"http://127.0.0.1:{port}", token=token)
        self._wait_api()
        # Outside the tier's root (the reconciler would see a stray file there), on its
        # filesystem (each run's step is a hard link to it).
        self.original = self.work / "source" / SHARD
        self.crc = write_shard(self.original, self.size)
        # A tiny checkpoint first: the workers' imports, connections and first workflow are
        # not what a large shard costs.
        self._register(self._step_dir(), b"warm-up")
        self._wait()
        self._clear()
        rows = []
        for w in WORKERS:
            rows.append(Row(f"{w}: RSS at idle", metric=f"{w} idle", unit="MiB"))
            rows.append(
                Row(
                    f"{w}: peak RSS",
                    metric=f"{w} peak",
                    unit="MiB",
                    baseline=f"{w}: RSS at idle",
                )
            )
        rows.append(Row("registration -> restorable on S3", nbytes=self.size))
        return [
            Method("large shard", self._run, tuple(rows), before=self._fresh_s3, after=self._clear)
        ]

    def _fresh_s3(self) -> None:
        self.moto.stop()
        self.moto.start(log_file=self.work / "moto.log")
        self.s3.create_bucket(Bucket=self.bucket)

    def _start(self, label: str, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.work / f"{label.replace(' ', '-')}.log", "ab")  # noqa: SIM115
        self.procs[label] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _wait_api(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.client.tiers()
                return
            except Exception as e:
                if time.monotonic() > deadline or any(
                    p.poll() is not None for p in self.procs.values()
                ):
                    raise RuntimeError(f"the API or a worker did not start: see {self.work}") from e
                time.sleep(0.3)

    def _step_dir(self) -> Path:
        self.step += 1
        return self.nodes / NODE / self.job / str(self.step)

    def _register(self, directory: Path, data: bytes | None = None) -> None:
        directory.mkdir(parents=True)
        if data is not None:
            (directory / SHARD).write_bytes(data)
            size, crc = len(data), crc32c.crc32c(data)
        else:
            os.link(self.original, directory / SHARD)
            size, crc = self.size, self.crc
        spec = ShardSpec(path=SHARD, size=size, crc32c=f"{crc:08x}", node=NODE)
        self.client.register_manifest(self.job, self.step, [spec])

    def _wait(self) -> None:
        for tier in ("lustre", "s3"):
            self.client.wait_restorable(self.job, self.step, tier, WAIT, 0.1)

    def _run(self) -> Outcome:
        pids = {w: self.procs[w].pid for w in WORKERS}
        idle = {w: status_kib(pid, "VmRSS") for w, pid in pids.items()}
        reset = all(reset_peak(pid) for pid in pids.values())
        directory = self._step_dir()
        with Sampler(pids) as sampler:
            t0 = time.perf_counter()
            self._register(directory)
            self._wait()
            seconds = time.perf_counter() - t0
        metrics = {"seconds": seconds}
        for w, pid in pids.items():
            peak = sampler.peak[w]
            if reset:
                peak = max(peak, status_kib(pid, "VmHWM"))
            metrics[f"{w} idle"] = idle[w] / 1024
            metrics[f"{w} peak"] = peak / 1024
        return Outcome(metrics)

    def _clear(self) -> None:
        shutil.rmtree(self.shared / self.job, ignore_errors=True)
        empty_bucket(self.s3, self.bucket)
        drop_cache(self.original.parent)

    def close(self) -> None:
        try:
            for p in self.procs.values():
                p.terminate()
            for p in self.procs.values():
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        finally:
            # Whatever failed above (or in the run), nothing the scenario started outlives it.
            self.moto.stop()
            if self.temporal is not None:
                self.temporal.stop()
            if self.pg is not None:
                self.pg.stop()
            shutil.rmtree(self.work, ignore_errors=True)


def write_shard(path: Path, size: int) -> int:
    """Write and fsync `size` bytes of incompressible data; returns their crc32c."""
    path.parent.mkdir(parents=True)
    block = os.urandom(8 * MiB)
    crc = 0
    with open(path, "wb", buffering=0) as f:
        left = size
        while left:
            chunk = memoryview(block)[: min(left, len(block))]
            f.write(chunk)
            crc = crc32c.crc32c(chunk, crc)
            left -= len(chunk)
        os.fsync(f.fileno())
    return crc
