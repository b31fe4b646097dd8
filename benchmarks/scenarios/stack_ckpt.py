"""What the scenarios that drive the dev stack end to end share: shards written onto a node's local
tier (crc32c computed while writing, as a training job does), registration, waiting for tiers,
the per-tier times from the catalog, raw boto3 transfers with the TransferConfig used as the
baseline, and removal of a finished run's copies (moto keeps every object in memory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import crc32c
from boto3.s3.transfer import TransferConfig
from tierpoint_client import Client
from tierpoint_client.models import ShardSpec

from benchmarks.env import DevStackProcess, Env
from benchmarks.harness import Watched
from benchmarks.scenarios.s3_upload import empty_bucket

MiB = 1024 * 1024
WAIT = 900.0  # hang guard for the background copies
TIERS = ("ssd", "lustre", "s3")
# The raw baseline's transfer settings for this endpoint: moto is single-threaded and pays per
# request, so an object of up to 64 MiB goes in one PutObject/GetObject (no multipart
# create/complete round trips) and four objects move at once, which keeps moto busy while the
# client reads the next file.
RAW_THREADS = 4
RAW_CONFIG = TransferConfig(
    multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=RAW_THREADS
)


def write_shards(
    directory: Path, names: Sequence[str], size: int, block: bytes, *, crc: bool = True
) -> list[int]:
    """Write and fsync each shard (the local tier's copy as training leaves it); returns each
    shard's crc32c, computed on the way (without `crc`: zeros, the disk's floor)."""
    directory.mkdir(parents=True, exist_ok=True)
    view = memoryview(block)
    crcs = []
    for i, name in enumerate(names):
        value = 0
        # The first 8 bytes differ per shard so that no two shards are the same object.
        first = bytearray(view[: min(size, len(view))])
        first[: min(8, len(first))] = i.to_bytes(8, "little")[: len(first)]
        with open(directory / name, "wb", buffering=0) as f:
            chunk: bytes | bytearray | memoryview = first
            left = size
            while left:
                f.write(chunk)
                if crc:
                    value = crc32c.crc32c(chunk, value)
                left -= len(chunk)
                chunk = view[: min(left, len(view))]
            os.fsync(f.fileno())
        crcs.append(value)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return crcs


def cp_sync(src: Path, dst: Path) -> None:
    """`cp -r` of a checkpoint directory, then `sync` of exactly the copied files."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst), *(str(p) for p in dst.iterdir())], check=True)


def fsync_tree(directory: Path) -> None:
    subprocess.run(["sync", str(directory), *(str(p) for p in directory.iterdir())], check=True)


class Stack:
    """The dev stack as a training job sees it: the API with the stack's token, its nodes' local
    roots, the shared root and its S3 bucket (the tier's endpoint)."""

    def __init__(self, env: Env) -> None:
        self.process: DevStackProcess = env.stack()
        info = self.process.info
        assert info is not None
        self.info = info
        self.client = Client(info.api_url, token=info.token)
        self.nodes = list(info.nodes)
        assert info.shared_root is not None, "the benchmark runs on the default tiers"
        self.shared = Path(info.shared_root)
        self.bucket = info.s3.bucket
        self.s3 = boto3.client(
            "s3",
            endpoint_url=info.s3.endpoint_url,
            region_name=info.s3.region,
            aws_access_key_id=info.s3.access_key_id,
            aws_secret_access_key=info.s3.secret_access_key,
        )

    def watched(self) -> Watched:
        """The stack's processes and this one (the writes, cp/boto3 baselines and restores run
        here; a `cp` or `sync` child counts once it is reaped)."""
        return {**self.process.pids(), "bench": (os.getpid(), False)}

    def local_dir(self, node: str, job: str, step: int) -> Path:
        return Path(self.info.nodes[node]) / job / str(step)

    def register(self, job: str, step: int, shards: Sequence[ShardSpec]) -> None:
        body = self.client.register_manifest(job, step, shards)
        if body.get("step") != step:
            raise RuntimeError(f"registration of {job}/{step} answered {body}")

    def wait(self, job: str, step: int, tiers: Sequence[str] = ("lustre", "s3")) -> None:
        for tier in tiers:
            self.client.wait_restorable(job, step, tier, WAIT, 0.05)

    def restorable_everywhere(self, job: str, step: int, shards: int, size: int) -> str:
        """`shards` files of `size` bytes written on the first node's local tier, registered and
        waited for until restorable on the shared tier and S3; the node. Readers of S3 in this
        process (the client) find the stack's credentials where its tiers name them."""
        node = self.nodes[0]
        names = shard_names(shards)
        block = bytes(range(256)) * (min(size, 16 * MiB) // 256 + 1)
        crcs = write_shards(self.local_dir(node, job, step), names, size, block)
        self.register(job, step, manifest(names, size, crcs, node))
        self.wait(job, step)
        for name, value in self.info.s3.credential_vars().items():
            os.environ.setdefault(name, value)
        return node

    def restorable_at(self, job: str, step: int) -> dict[str, float]:
        """Each tier's restorable_at (epoch seconds) as the catalog recorded it."""
        cp = self.client.checkpoint(job, step)
        return {
            t.tier: t.restorable_at.timestamp() for t in cp.tiers if t.restorable_at is not None
        }

    def events(self, job: str, step: int) -> list[dict[str, Any]]:
        """The checkpoint's event history (the client has no call for this operator read)."""
        req = urllib.request.Request(
            f"{self.info.api_url}/v1/jobs/{job}/checkpoints/{step}/events?limit=1000",
            headers={"Authorization": f"Bearer {self.info.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            items: list[dict[str, Any]] = json.load(resp)["items"]
        return items

    def forget(self, job: str) -> None:
        """Remove a finished run's copies from every tier (untimed, before the next run): the
        catalog still lists them, but nothing reads them again."""
        for root in self.info.nodes.values():
            shutil.rmtree(Path(root) / job, ignore_errors=True)
        shutil.rmtree(self.shared / job, ignore_errors=True)
        empty_bucket(self.s3, self.bucket, f"{job}/")

    def upload(self, src: Path, prefix: str) -> None:
        """boto3 upload_file of every file under `src` to `prefix`, RAW_THREADS files at once."""
        files = sorted(p for p in src.iterdir() if p.is_file())
        with ThreadPoolExecutor(RAW_THREADS) as pool:
            list(
                pool.map(
                    lambda p: self.s3.upload_file(
                        str(p), self.bucket, f"{prefix}{p.name}", Config=RAW_CONFIG
                    ),
                    files,
                )
            )

    def download(self, prefix: str, dst: Path) -> None:
        """boto3 download_file of every object under `prefix`, then fsync of the files."""
        dst.mkdir(parents=True)
        keys = [
            o["Key"]
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for o in page.get("Contents", [])
        ]
        with ThreadPoolExecutor(RAW_THREADS) as pool:
            list(
                pool.map(
                    lambda k: self.s3.download_file(
                        self.bucket, k, str(dst / k[len(prefix) :]), Config=RAW_CONFIG
                    ),
                    keys,
                )
            )
        fsync_tree(dst)


def manifest(names: Sequence[str], size: int, crcs: Sequence[int], node: str) -> list[ShardSpec]:
    return [
        ShardSpec(path=n, size=size, crc32c=f"{c & 0xFFFFFFFF:08x}", node=node)
        for n, c in zip(names, crcs, strict=True)
    ]


def shard_names(count: int, node: str = "") -> list[str]:
    prefix = f"{node}-" if node else ""
    return [f"{prefix}shard-{i:03d}.bin" for i in range(count)]
