"""The lifecycle workflow (workflows/checkpoint_lifecycle.py) end to end on real services: Temporal
dev server, Postgres, moto S3, real files. Its stages' batch windows: test_lifecycle_window.py."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import (
    NODES,
    RESULT_TIMEOUT,
    ShardSpec,
    assert_bytes_everywhere,
    crc_hex,
    markers,
    new_job,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.services import Services
from tierpoint.catalog.models import Checkpoint, Event, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import (
    LifecycleInput,
    LifecycleResult,
    LifecycleStatus,
    workflow_id,
)
from tierpoint.temporal import start_lifecycle


def replica_states(
    sessions: sessionmaker[Session], checkpoint_id: int
) -> dict[tuple[str, str], str]:
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Replica.tier, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id)
        )
        return {(p, t): st for p, t, st in rows}


def events(
    sessions: sessionmaker[Session], checkpoint_id: int
) -> list[tuple[str, str | None, dict[str, Any]]]:
    with sessions() as s:
        rows = s.execute(
            select(Event.kind, Event.tier, Event.detail)
            .where(Event.checkpoint_id == checkpoint_id)
            .order_by(Event.id)
        )
        return [(k, t, d) for k, t, d in rows]


async def test_two_nodes_become_restorable_on_every_tier(
    settings: Settings, services: Services, sessions: sessionmaker[Session], client: Client
) -> None:
    shards = random_shards(NODES, 3, 300_000)
    # A shard registered without a checksum: the seal stage computes and records it.
    data = os.urandom(123_457)
    shards.append(ShardSpec("node-b", "extra/no-checksum.bin", data, None))
    seeded = seed_checkpoint(settings, sessions, new_job(), 100, shards)
    copied_before = (
        REGISTRY.get_sample_value("tierpoint_worker_bytes_copied_total", {"tier": "s3"}) or 0.0
    )

    async with running_workers(settings, client):
        result, handle = await run_lifecycle(client, seeded)
        status = await handle.query("status", result_type=LifecycleStatus)

    assert [(t.tier, t.state) for t in result.tiers] == [
        ("ssd", "restorable"),
        ("lustre", "restorable"),
        ("s3", "restorable"),
    ]
    assert status.stage == "done"
    # Sealed first, then both copies at once, each promoted when it is verified.
    assert status.tiers_done[0] == "ssd" and sorted(status.tiers_done[1:]) == ["lustre", "s3"]
    assert {t: st for t, (st, _) in markers(sessions, seeded.checkpoint_id).items()} == {
        "ssd": "restorable",
        "lustre": "restorable",
        "s3": "restorable",
    }
    states = replica_states(sessions, seeded.checkpoint_id)
    assert len(states) == 3 * len(shards)
    assert set(states.values()) == {"verified"}
    assert_bytes_everywhere(settings, services, seeded)

    with sessions() as s:
        sealed_crc = s.scalar(
            select(Shard.checksum).where(
                Shard.checkpoint_id == seeded.checkpoint_id, Shard.path == "extra/no-checksum.bin"
            )
        )
        bytes_done = s.scalar(
            select(func.sum(Replica.bytes_done)).where(
                Replica.checkpoint_id == seeded.checkpoint_id, Replica.tier == "s3"
            )
        )
    assert sealed_crc == crc_hex(data)
    copied_after = REGISTRY.get_sample_value("tierpoint_worker_bytes_copied_total", {"tier": "s3"})
    assert copied_after == copied_before + sum(len(x.data) for x in shards)
    assert bytes_done == sum(len(x.data) for x in shards)

    kinds = [(k, t) for k, t, _ in events(sessions, seeded.checkpoint_id)]
    for tier in ("ssd", "lustre", "s3"):
        assert ("promoted", tier) in kinds
    assert ("sealed", "ssd") in kinds
    assert ("copied", "lustre") in kinds and ("copied", "s3") in kinds
    assert not any(k in ("corrupt", "failed") for k, _ in kinds)

    if recording_histories():
        await record_history(client, handle.id, "lifecycle_two_nodes")


async def test_shard_with_wrong_checksum_is_never_promoted(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    shards = random_shards(NODES, 2, 50_000)
    bad = shards[1]
    shards[1] = ShardSpec(bad.node, bad.path, bad.data, crc_hex(b"not these bytes"))
    seeded = seed_checkpoint(settings, sessions, new_job(), 7, shards)

    async with running_workers(settings, client):
        result, _ = await run_lifecycle(client, seeded)

    outcome = {t.tier: (t.state, t.reason) for t in result.tiers}
    assert outcome["ssd"][0] == "failed"
    assert outcome["lustre"] == outcome["s3"] == ("failed", "source tier ssd failed")
    marks = markers(sessions, seeded.checkpoint_id)
    state, reason = marks["ssd"]
    assert state == "failed"
    assert reason is not None and "1 of 4 shards" in reason and bad.path in reason
    assert marks["lustre"] == ("failed", "source tier ssd failed")
    assert marks["s3"] == ("failed", "source tier ssd failed")
    states = replica_states(sessions, seeded.checkpoint_id)
    assert states[(bad.path, "ssd")] == "corrupt"
    # Nothing went further than the tier that failed.
    assert not any(t != "ssd" for _, t in states)
    assert not shard_file(settings, "lustre", None, seeded.job, seeded.step, bad.path).exists()
    kinds = {(k, t) for k, t, _ in events(sessions, seeded.checkpoint_id)}
    assert {("corrupt", "ssd"), ("failed", "ssd"), ("failed", "lustre"), ("failed", "s3")} <= kinds
    assert not any(k == "promoted" for k, _ in kinds)


async def test_reconciler_starts_a_missing_lifecycle(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    seeded = seed_checkpoint(
        settings, sessions, new_job(), 3, random_shards(NODES, 1, 1000), started=False
    )
    async with running_workers(settings, client):
        for _ in range(600):
            with sessions() as s:
                started = s.scalar(
                    select(Checkpoint.workflow_started_at).where(
                        Checkpoint.id == seeded.checkpoint_id
                    )
                )
            if started is not None:
                break
            await asyncio.sleep(0.2)
        assert started is not None
        handle = client.get_workflow_handle(
            workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
        )
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert [t.state for t in result.tiers] == ["restorable"] * 3


async def test_copy_resumes_after_workers_stop_mid_copy(
    settings: Settings, services: Services, sessions: sessionmaker[Session], client: Client
) -> None:
    # Reads off the local tier at 4 MB/s: copying the 40 MiB shard to lustre takes ~10 s, in
    # 8 MiB chunks (the POSIX store's buffer), each reported as progress.
    ssd = settings.tier("ssd").model_copy(update={"read_bandwidth_limit": 4_000_000})
    slow = settings.model_copy(update={"tiers": [ssd, *settings.tiers[1:]]})
    data = os.urandom(40 * 1024 * 1024)
    shards = [ShardSpec("node-a", "big.bin", data, crc_hex(data))]
    seeded = seed_checkpoint(slow, sessions, new_job(), 11, shards)
    await start_lifecycle(
        client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step)
    )

    def lustre_progress() -> tuple[str | None, int]:
        with sessions() as s:
            row = s.execute(
                select(Replica.state, Replica.bytes_done).where(
                    Replica.checkpoint_id == seeded.checkpoint_id, Replica.tier == "lustre"
                )
            ).one_or_none()
        return (row[0], row[1]) if row else (None, 0)

    async with running_workers(slow, client, nodes=["node-a"], graceful_shutdown=timedelta(0)):
        for _ in range(1200):
            state, done = lustre_progress()
            if state == "copying" and done > 0:
                break
            await asyncio.sleep(0.1)
        assert state == "copying" and 0 < done < len(data)
        # Leaving the block stops the workers, without grace, in the middle of the copy.

    state, done_after_stop = lustre_progress()
    assert state == "copying" and done_after_stop < len(data)

    async with running_workers(slow, client, nodes=["node-a"]):
        handle = client.get_workflow_handle(
            workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
        )
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

    assert [t.state for t in result.tiers] == ["restorable"] * 3
    assert_bytes_everywhere(slow, services, seeded)
    copied = [
        d for k, t, d in events(sessions, seeded.checkpoint_id) if (k, t) == ("copied", "lustre")
    ]
    assert len(copied) == 1
    assert copied[0]["attempt"] >= 2
    assert copied[0]["resumed"] and copied[0]["resumed"][0]["offset"] > 0
    # Only what was left was read again.
    assert copied[0]["bytes"] < len(data)
