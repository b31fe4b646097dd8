"""A shared tier that cannot take a copy (full: here a node worker whose files may not grow past
1 MiB, so the write fails in the kernel with EFBIG as a full device fails with ENOSPC) says why in
the operator views: the copy in flight carries the write's error, not only "0 B free" and a line
in the worker's log, and so does the failure once the tier fails.

Real services; the node's worker is a `tierpoint worker` process with RLIMIT_FSIZE, the shared
worker runs in the test process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import crc32c
from sqlalchemy import Engine
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, manifest, running_client, set_marker, shard
from tests.helpers.lifecycle import running_workers, shard_file
from tests.helpers.worker_process import worker_process
from tierpoint.config import Settings

MiB = 1024 * 1024
# Guards against a hang, not a performance assertion.
TIMEOUT = 120.0


async def test_a_tier_that_cannot_take_the_copy_says_why(
    settings: Settings,
    temporal: Client,
    catalog: Engine,
    nodes: tuple[str, str],
    job: str,
    tmp_path: Path,
) -> None:
    data = os.urandom(2 * MiB)
    f = shard_file(settings, "ssd", NODE_A, job, 1, "big.bin")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    body = manifest(1, [shard("big.bin", size=len(data), crc=f"{crc32c.crc32c(data):08x}")])
    with worker_process(settings, NODE_A, tmp_path / "node-a.log", file_size_limit=MiB) as node:
        async with running_workers(settings, temporal, nodes=()):
            async for c in running_client(create_app(settings)):
                r = await c.post(f"/v1/jobs/{job}/checkpoints", json=body)
                assert r.status_code == 201, r.text
                async with asyncio.timeout(TIMEOUT):
                    while True:
                        items = (await c.get("/v1/copies/in-flight", params={"job": job})).json()[
                            "items"
                        ]
                        stuck = [i for i in items if i["tier"] == "lustre" and i["last_error"]]
                        if stuck:
                            break
                        assert node.alive(), node.output()
                        await asyncio.sleep(0.2)
                (copy,) = stuck
                assert copy["last_error"].startswith("write to lustre: "), copy
                assert "File too large" in copy["last_error"], copy
                # Its attempts run out after many minutes and the tier is failed (set here):
                # the failures view carries the same error beside the promotion's reason.
                set_marker(catalog, job, 1, "lustre", "failed", reason="1 shard(s) not copied")
                r = await c.get("/v1/failures", params={"job": job})
                (failure,) = r.json()["items"]
                assert failure["last_error"] == copy["last_error"], failure
