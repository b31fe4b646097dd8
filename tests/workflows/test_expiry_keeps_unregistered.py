"""We delete only what we registered, end to end: a checkpoint whose copies expire on every tier
(node-local, shared, S3) through the real lifecycle and retention workflows and workers loses its
registered shards there, and nothing else: a file the job wrote beside its shards, a file someone
put in the shared copy's directory and an object beside the S3 copy all survive with their bytes.

A symlink in the step directory, even one that stays inside the tier root, is refused at seal: the
shard never becomes verified and is never copied anywhere."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import Seeded, ShardSpec, running_workers, seed_checkpoint
from tests.helpers.retention import (
    NODES,
    RESULT_TIMEOUT,
    create_job,
    markers,
    s3_keys,
    settle,
    write_checkpoint,
)
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.models import Replica
from tierpoint.catalog.tier_copy.machine import ensure_tier_copies
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle
from tierpoint.tier_config import TierKind

KEEP_LAST_1 = {
    "tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 1}, "s3": {"keep_last": 1}}
}
OPTIMIZER = b"optimizer state the job never registered"


def _step_dir(settings: Settings, tier: str, node: str | None, job: str, step: int) -> Path:
    return settings.tier(tier).root_for(node) / job / str(step)


async def test_expiry_deletes_the_registered_shards_and_nothing_else(
    settings: Settings, sessions: sessionmaker[Session], client: Client, services: Services
) -> None:
    job = f"unreg-{uuid.uuid4().hex[:10]}"
    create_job(sessions, job, KEEP_LAST_1)
    s3 = next(t for t in settings.tiers if t.kind is TierKind.S3)
    assert s3.bucket is not None
    raw = s3_client(services)
    stranger_key = f"{s3.prefix}{job}/1/rank-{NODES[0]}/UNREGISTERED-optimizer.pt"
    # The job writes its shards (registered) and its optimizer state beside them (not).
    local_a = _step_dir(settings, "ssd", NODES[0], job, 1) / f"rank-{NODES[0]}"
    shared = _step_dir(settings, "lustre", None, job, 1) / f"rank-{NODES[0]}"
    async with running_workers(settings, client):
        local_a.mkdir(parents=True)
        (local_a / "UNREGISTERED-optimizer.pt").write_bytes(OPTIMIZER)
        seeded, result = await write_checkpoint(settings, sessions, client, job, 1)
        assert all(t.state == "restorable" for t in result.tiers), result
        # Others put files beside the shared copy and the S3 copy.
        (shared / "UNREGISTERED-notes.txt").write_bytes(b"an operator's notes")
        raw.put_object(Bucket=s3.bucket, Key=stranger_key, Body=OPTIMIZER)
        # The next checkpoint makes the first one expire on every tier (keep_last 1).
        await write_checkpoint(settings, sessions, client, job, 2)
        outcome = await settle(client, job)
    assert outcome.failed == 0
    state = markers(sessions, job)
    assert {tier: state[(1, tier)] for tier in ("ssd", "lustre", "s3")} == {
        "ssd": "expired",
        "lustre": "expired",
        "s3": "expired",
    }

    assert len(seeded.shards) == 2 * len(NODES)
    # Node-local: the job's own file is there with its bytes, every registered shard is gone.
    assert (local_a / "UNREGISTERED-optimizer.pt").read_bytes() == OPTIMIZER
    assert _files(local_a.parent) == {f"rank-{NODES[0]}/UNREGISTERED-optimizer.pt"}
    assert not _step_dir(settings, "ssd", NODES[1], job, 1).exists()  # emptied, so pruned
    # Shared: the same.
    assert (shared / "UNREGISTERED-notes.txt").read_bytes() == b"an operator's notes"
    assert _files(shared.parent) == {f"rank-{NODES[0]}/UNREGISTERED-notes.txt"}
    # S3: the registered keys are gone, the object beside them is not.
    assert s3_keys(services, settings, job)[1] == {f"rank-{NODES[0]}/UNREGISTERED-optimizer.pt"}
    assert raw.get_object(Bucket=s3.bucket, Key=stranger_key)["Body"].read() == OPTIMIZER


def _files(top: Path) -> set[str]:
    return {p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()}


async def _run_lifecycle(
    settings: Settings, sessions: sessionmaker[Session], client: Client, seeded: Seeded
) -> LifecycleResult:
    with sessions.begin() as s:
        head = checkpoint_head(s, seeded.checkpoint_id)
        assert head is not None
        ensure_tier_copies(s, head, settings.tier_names())
    inp = LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step)
    await start_lifecycle(client, inp)
    handle = client.get_workflow_handle(
        workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
    )
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert isinstance(result, LifecycleResult)
    return result


@pytest.mark.parametrize(
    ("link", "target", "shard"),
    [
        ("stolen.bin", "../../{victim}/10/model/r0.bin", "stolen.bin"),
        ("model", "../../{victim}/10/model", "model/r0.bin"),
    ],
    ids=["shard-symlink", "directory-symlink"],
)
async def test_a_symlink_to_another_jobs_shard_is_refused_at_seal(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    services: Services,
    link: str,
    target: str,
    shard: str,
) -> None:
    node = NODES[0]
    victim, thief = f"gpt-x-{uuid.uuid4().hex[:8]}", f"llama-sym-{uuid.uuid4().hex[:8]}"
    weights = b"gpt-x weights, rank 0"
    seed_checkpoint(
        settings, sessions, victim, 10, [ShardSpec(node, "model/r0.bin", weights, None)]
    )
    # The thief registers a shard that is a symlink (or lies under one) into the victim's step
    # directory, on the same tier root, with the size of the victim's file and no checksum.
    thief_shard = ShardSpec(node, shard, weights, None)
    seeded = seed_checkpoint(settings, sessions, thief, 4, [thief_shard])
    step_dir = _step_dir(settings, "ssd", node, thief, 4)
    shutil.rmtree(step_dir)
    step_dir.mkdir()
    (step_dir / link).symlink_to(target.format(victim=victim))
    async with running_workers(settings, client):
        result = await _run_lifecycle(settings, sessions, client, seeded)
    assert [t.tier for t in result.tiers if t.state == "restorable"] == []
    with sessions() as s:
        states = s.scalars(
            select(Replica.state).where(Replica.checkpoint_id == seeded.checkpoint_id)
        ).all()
    assert "verified" not in states
    # Never copied: nothing of the thief's on the shared tier or in S3.
    assert not (settings.tier("lustre").root_for(None) / thief).exists()
    assert s3_keys(services, settings, thief) == {}
    # The victim's file is untouched.
    assert (_step_dir(settings, "ssd", node, victim, 10) / "model/r0.bin").read_bytes() == weights
