"""A job registers step S, then writes S again (a rank restarted and saved once more, other
bytes, another size) before the seal reads it: the seal finds the files not as registered and
the checkpoint fails. An admin deletes it, and the job registers S again: its files must survive
the old checkpoint's delete and become the new checkpoint, restorable with the new bytes.

They did not (found by the stateful test): the seal recorded the identity of the file it found
wrong, and a delete removes the file whose identity the catalog recorded, as if the catalog had
verified it. The job's new files were deleted; the registration answered 201 and the new
checkpoint failed ("missing"). A read that finds a file not as registered now records nothing of
it: the delete then removes a file only if it holds the registered bytes.

By construction, not timing: the node's worker starts only after the job wrote the step again,
so the seal reads the new files. Real API (uvicorn), real workers, Postgres, Temporal and moto."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
from sqlalchemy import Engine
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client import ConflictError

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import crc_hex, running_workers, shard_file
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

STEP = 9
NODE = "node-a"
WAIT = 300.0  # hang guard only


def write(settings: Settings, job: str, data: bytes) -> Path:
    """The job's file of the step, under a temporary name and renamed into place."""
    final = shard_file(settings, "ssd", NODE, job, STEP, "a.bin")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".a.bin.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, final)
    return final


def manifest(data: bytes) -> list[dict[str, object]]:
    return [{"path": "a.bin", "size": len(data), "crc32c": crc_hex(data), "node": NODE}]


async def until_state(trainer: TierpointClient, job: str, tier: str, states: set[str]) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        cp = await asyncio.to_thread(trainer.checkpoint, job, STEP)
        copy = cp.tier(tier)
        if copy is not None and copy.state in states:
            return copy.state
        assert loop.time() < deadline, f"{tier} never {states}: {cp.tiers}"
        await asyncio.sleep(0.2)


async def register_until_accepted(trainer: TierpointClient, job: str, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        try:
            await asyncio.to_thread(trainer.register_manifest, job, STEP, manifest(data))
            return
        except ConflictError as e:
            assert e.code == "checkpoint_being_deleted", e
        assert loop.time() < deadline, "never registered again"
        await asyncio.sleep(0.2)


async def test_a_delete_after_a_failed_seal_keeps_the_files_the_job_wrote_since(
    settings: Settings, client: Client, engine: Engine
) -> None:
    job = f"failed-seal-{uuid.uuid4().hex[:10]}"
    admin = create_token(settings.database_url, scopes=["admin"])
    old, new = os.urandom(4096), os.urandom(4097)

    async with (
        running_workers(settings, client, nodes=(), shared=True),
        serving(create_app(settings)) as api,
    ):
        trainer = TierpointClient(
            api, token=create_token(settings.database_url, scopes=[f"train:{job}"])
        )
        # The node is known (its worker reported in once); its worker is stopped again.
        since = db_now(engine)
        async with running_workers(settings, client, nodes=(NODE,), shared=False):
            await workers_reported_in(engine, (NODE,), since)
        write(settings, job, old)
        await asyncio.to_thread(trainer.register_manifest, job, STEP, manifest(old))
        # Written again before the seal reads it: no node worker runs now.
        final = write(settings, job, new)
        since = db_now(engine)
        async with running_workers(settings, client, nodes=(NODE,), shared=False):
            await workers_reported_in(engine, (NODE,), since)
            assert await until_state(trainer, job, "ssd", {"failed"}) == "failed"
            async with httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http:
                r = await http.delete(f"/v1/jobs/{job}/checkpoints/{STEP}")
            assert r.status_code == 202, r.text
            await register_until_accepted(trainer, job, new)
            assert final.read_bytes() == new
            for tier in ("ssd", "lustre", "s3"):
                assert await until_state(trainer, job, tier, {"restorable", "failed"}) == (
                    "restorable"
                ), tier
    assert final.read_bytes() == new
