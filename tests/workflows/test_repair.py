"""The repair workflow (workflows/repair.py) end to end. A copy that finds its source replica
corrupt reaches the same outcome as a scrub that finds it: the replica is marked corrupt and its
tier demoted in one transaction (never quarantined, which would keep repair away from it for
good), and the lifecycle asks for the checkpoint's repair, which copies the shard again from a
tier that holds it verified and promotes the demoted tier and the one the copy could not fill.

The copy here is an operator's retry of an S3 copy that had failed, run after one byte of the node's
local file it reads from rotted (copies fan out from the sealed local tier). (That the tier is
demoted and counted right the moment the copy finds it is shown without workers by
tests/activities/test_lifecycle.py and tests/api/test_quarantine.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.orm import Session
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from api.app import create_app
from tests.helpers.api import NODE_A, NODE_B, running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import OVERALL_TIMEOUT, marker_states
from tests.helpers.integrity import (
    events,
    flip_file,
    integrity_settings,
    promoted,
    repair_result,
    replica_states,
    s3_key,
)
from tests.helpers.lifecycle import (
    Seeded,
    ShardSpec,
    activities_run,
    crc_hex,
    record_history,
    recording_histories,
    running_workers,
    shard_file,
)
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Replica, Shard, TierCopy
from tierpoint.catalog.tier_copy.damage import mark_damaged_shards
from tierpoint.config import Settings
from tierpoint.contract.integrity import REPAIR_REQUEST
from tierpoint.contract.lifecycle import (
    COPY_BATCH,
    LifecycleInput,
    LifecycleResult,
    workflow_id,
)
from tierpoint.states import ReplicaState
from tierpoint.temporal import request_repair, start_lifecycle


def _s3_copy_failed_earlier(engine: Engine, checkpoint_id: int) -> None:
    """As an S3 outage leaves a copy, then an operator's retry: marker pending, no replicas."""
    with Session(engine) as s, s.begin():
        s.execute(
            delete(Replica).where(Replica.checkpoint_id == checkpoint_id, Replica.tier == "s3")
        )
        s.execute(
            update(TierCopy)
            .where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == "s3")
            .values(state="pending", reason=None, restorable_at=None)
        )


async def _retried_s3_copy_failed(
    client: Client, seeded: Seeded
) -> tuple[str, WorkflowHandle[Any, LifecycleResult]]:
    """An operator's retry of the checkpoint's lifecycle, run to its end: its S3 copy failed,
    since the copy read a rotten source. Returns the run's id and handle."""
    job, step = seeded.job, seeded.step
    retry = LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step)
    run_id = f"{workflow_id(job, step)}/retry-1"
    assert await start_lifecycle(client, retry, run_id=run_id)
    handle = client.get_workflow_handle(run_id, result_type=LifecycleResult)
    result = await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)
    assert {t.tier: t.state for t in result.tiers}["s3"] == "failed", result
    return run_id, handle


async def test_a_copy_finding_its_source_corrupt_demotes_it_and_repair_heals_it(
    settings: Settings, services: Services, client: Client
) -> None:
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine)
        job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
        rotten = seeded.shards[0]
        _s3_copy_failed_earlier(engine, cp)
        flip_file(cfg, "ssd", seeded, rotten)

        async for api in running_client(create_app(cfg)):
            async with running_workers(cfg, client):
                run_id, handle = await _retried_s3_copy_failed(client, seeded)
                # The lifecycle itself asked for the repair before it returned.
                queued, local = activities_run(await handle.fetch_history())
                assert queued[REPAIR_REQUEST] >= 1, (queued, local)
                if recording_histories():
                    await record_history(client, run_id, "lifecycle_repairs_its_source")
                # The repair the lifecycle asked for copies from lustre.
                repaired = await repair_result(client, seeded)
            assert {t.tier: t.state for t in repaired.tiers} == {
                "ssd": "restorable",
                "s3": "restorable",
            }, repaired

            # Found and demoted as a scrub's finding is (never quarantined), then repaired.
            kinds = [(k, t) for k, t, _ in events(engine, cp, "corrupt", "quarantined")]
            assert ("corrupt", "ssd") in kinds and ("quarantined", "ssd") not in kinds
            found = next(d for k, t, d in events(engine, cp, "corrupt") if t == "ssd")
            assert found["marker_demoted"] is True and found["count"] == 1, found
            ssd = [
                k for k, t, _ in events(engine, cp, "corrupt", "repaired", "promoted") if t == "ssd"
            ]
            assert ssd == ["promoted", "corrupt", "repaired", "promoted"], ssd
            repairs = {t: d for k, t, d in events(engine, cp, "repaired")}
            assert set(repairs) == {"ssd", "s3"}, repairs
            # The damaged ssd copy from lustre; s3 from the fastest tier verified by then.
            assert repairs["ssd"]["sources"] == {"lustre": 1}, repairs
            assert repairs["s3"]["sources"] in ({"ssd": 1}, {"lustre": 1}), repairs

            assert marker_states(engine, cp) == dict.fromkeys(("ssd", "lustre", "s3"), "restorable")
            assert replica_states(engine, cp)[("ssd", rotten.path)] == "verified"
            assert shard_file(cfg, "ssd", rotten.node, job, step, rotten.path).read_bytes() == (
                rotten.data
            )
            s3 = s3_client(services)
            body = s3.get_object(Bucket=cfg.tier("s3").bucket, Key=s3_key(cfg, seeded, rotten))
            assert body["Body"].read() == rotten.data
            r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}")
            tiers = {t["tier"]: t for t in r.json()["tiers"]}
            assert tiers["ssd"]["quarantine_reason"] is None, tiers
            r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
            assert r.status_code == 200 and r.json()["step"] == step, r.text
        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.restorable == dict.fromkeys(("ssd", "lustre", "s3"), 1)
    finally:
        engine.dispose()


def _copies_finished(history: WorkflowHistory, tier: str) -> list[str]:
    """The nodes whose copy batches to `tier` completed, in the order the server recorded."""
    nodes: dict[int, str] = {}
    finished = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == COPY_BATCH:
                inp = json.loads(attrs.input.payloads[0].data)
                if inp["destination"] == tier:
                    nodes[e.event_id] = inp["batch"]["node"]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = e.activity_task_completed_event_attributes.scheduled_event_id
            if done in nodes:
                finished.append(nodes[done])
    return finished


async def test_a_source_found_corrupt_by_the_batch_that_finishes_first_still_asks_for_repair(
    settings: Settings, client: Client
) -> None:
    """A stage adds up what its batches found: a batch that found its source corrupt and
    finished before a clean one still counts. (The sum was once read before each batch's wait
    and written back after it, so the clean batch finishing last wrote the count back to 0 and
    the repair was never asked for.) Node a's only shard is small and rotten; node b's is large
    and read through a bandwidth limit, so node b's copy finishes seconds after node a's."""
    ssd_limit = 2 * 1024 * 1024
    cfg = integrity_settings(settings)
    tiers = [
        t.model_copy(update={"read_bandwidth_limit": ssd_limit}) if t.name == "ssd" else t
        for t in cfg.tiers
    ]
    cfg = cfg.model_copy(update={"tiers": tiers})
    small, large = os.urandom(64_000), os.urandom(2 * ssd_limit)
    shards = [
        ShardSpec(NODE_A, "rank-0/small.bin", small, crc_hex(small)),
        ShardSpec(NODE_B, "rank-1/large.bin", large, crc_hex(large)),
    ]
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine, shards=shards)
        cp = seeded.checkpoint_id
        _s3_copy_failed_earlier(engine, cp)
        flip_file(cfg, "ssd", seeded, seeded.shards[0])

        async with running_workers(cfg, client):
            run_id, handle = await _retried_s3_copy_failed(client, seeded)
            history = await handle.fetch_history()
            # What the test staged: the copy that found the rotten source finished first.
            assert _copies_finished(history, "s3") == [NODE_A, NODE_B]
            if recording_histories():
                await record_history(client, run_id, "lifecycle_source_damage_first")
            queued, local = activities_run(history)
            assert queued[REPAIR_REQUEST] == 1, (queued, local)
            repaired = await repair_result(client, seeded)
        assert {t.tier: t.state for t in repaired.tiers} == {
            "ssd": "restorable",
            "s3": "restorable",
        }, repaired
        assert marker_states(engine, cp) == dict.fromkeys(("ssd", "lustre", "s3"), "restorable")
    finally:
        engine.dispose()


async def test_a_source_gone_since_the_plan_is_marked_and_later_rounds_finish_the_repair(
    settings: Settings, client: Client
) -> None:
    """The node's disk lost a file behind the catalog's back: the shared tier's damaged copy is
    planned from the node's local copy (the fastest verified one), the copy finds that gone and
    marks it, and repair goes on rather than leaving the shared tier failed: the local copy is
    made again from S3, and then the shared one from it (planned anew once the local copy was
    back: the round that mended it had planned the shared copy for the other queue)."""
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine)
        job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
        bad = seeded.shards[0]
        shard_file(cfg, "ssd", bad.node, job, step, bad.path).unlink()
        flip_file(cfg, "lustre", seeded, bad)
        with Session(engine) as s, s.begin():
            (shard_id,) = s.execute(
                select(Shard.id).where(Shard.checkpoint_id == cp, Shard.path == bad.path)
            ).one()
            mark_damaged_shards(
                s, "lustre", {shard_id: "flipped by the test"}, ReplicaState.CORRUPT, "test"
            )

        async with running_workers(cfg, client):
            await request_repair(client, cp, job, step, "the test damaged the shared copy")
            repaired = await repair_result(client, seeded)
        assert {t.tier: t.state for t in repaired.tiers}["lustre"] == "restorable", repaired
        assert repaired.rounds >= 3, repaired
        states = replica_states(engine, cp)
        assert states[("lustre", bad.path)] == "verified"
        assert states[("ssd", bad.path)] in ("lost", "corrupt", "verified"), states
        assert shard_file(cfg, "lustre", None, job, step, bad.path).read_bytes() == bad.data
        repairs = [(t, d["sources"]) for k, t, d in events(engine, cp, "repaired")]
        assert ("ssd", {"s3": 1}) in repairs and ("lustre", {"ssd": 1}) in repairs, repairs
        assert marker_states(engine, cp)["lustre"] == "restorable"
    finally:
        engine.dispose()
