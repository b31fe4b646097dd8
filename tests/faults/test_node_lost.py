"""A node declared lost in the middle of a lifecycle: its worker process is SIGKILLed while it
copies a shard to the shared tier and to s3 (the machine is gone), then an operator declares the
node lost through the API. The lifecycle waiting on the node's task queue stops waiting and fails
the tiers it could not reach with a clear reason; an older checkpoint that got to lustre and s3
before the loss stays restorable there, and latest restorable falls back to it. Nothing that was on
a durable tier is lost; what was only on the lost node's disk is reported lost, not restorable.

By construction, not by timing: the lost node's shard is read off its ssd at 4 MiB/s (16 MiB,
~4 s to copy), its worker is killed only once the catalog shows the copy to lustre under way, and
the test fails saying so if the copy had finished by then. Without the declaration the lifecycle
would wait forever: no other worker may serve a node's queue."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers, assert_nothing_lost
from tests.helpers.faults import OVERALL_TIMEOUT, POLL, marker_states
from tests.helpers.lifecycle import (
    NODES,
    Seeded,
    ShardSpec,
    crc_hex,
    new_job,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.services import with_tier
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.models import Replica, Shard, TierCopy
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle

LOST, ALIVE = NODES
BIG = 16 * 1024 * 1024
READ_LIMIT = 4 * 1024 * 1024
TOO_LATE = "the lost node's copy finished before its worker was killed: slow it (READ_LIMIT)"


def shards_of(node_data: dict[str, bytes], node: str) -> list[ShardSpec]:
    return [ShardSpec(node, p, d, crc_hex(d)) for p, d in node_data.items()]


def replica(engine: Engine, checkpoint_id: int, node: str, tier: str) -> tuple[str | None, int]:
    with engine.connect() as conn:
        row = conn.execute(
            select(Replica.state, Replica.bytes_done)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id, Shard.node_id == node)
            .where(Replica.tier == tier)
        ).first()
    return (str(row[0]), int(row[1] or 0)) if row else (None, 0)


def lost_copy(engine: Engine, seeded: Seeded) -> tuple[str | None, int]:
    """The lost node's shard's copy to lustre."""
    return replica(engine, seeded.checkpoint_id, LOST, "lustre")


async def lifecycle(client: Client, seeded: Seeded) -> LifecycleResult:
    ref = LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=seeded.step)
    await start_lifecycle(client, ref)
    handle = client.get_workflow_handle(
        workflow_id(seeded.job, seeded.step), result_type=LifecycleResult
    )
    result: LifecycleResult = await handle.result()
    return result


def reasons(engine: Engine, checkpoint_id: int) -> dict[str, str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(TierCopy.tier, TierCopy.reason).where(TierCopy.checkpoint_id == checkpoint_id)
        )
        return {t: r for t, r in rows}


async def test_node_declared_lost_mid_copy_stops_waiting_and_falls_back(
    settings: Settings,
    engine: Engine,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
) -> None:
    slow = with_tier(settings, "ssd", read_bandwidth_limit=READ_LIMIT)
    job = new_job()
    small = {LOST: {"a.bin": os.urandom(4096)}, ALIVE: {"b.bin": os.urandom(4096)}}
    one = seed_checkpoint(
        settings, sessions, job, 1, shards_of(small[LOST], LOST) + shards_of(small[ALIVE], ALIVE)
    )
    big = {LOST: {"a.bin": os.urandom(BIG)}, ALIVE: {"b.bin": os.urandom(4096)}}
    two = seed_checkpoint(
        settings,
        sessions,
        job,
        2,
        shards_of(big[LOST], LOST) + shards_of(big[ALIVE], ALIVE),
        started=False,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OVERALL_TIMEOUT

    async with running_workers(settings, client, nodes=[ALIVE], shared=True):
        with worker_process(slow, LOST, tmp_path / "lost-node-worker.log") as lost_worker:
            await start_lifecycle(
                client, LifecycleInput(checkpoint_id=one.checkpoint_id, job=job, step=1)
            )
            first = await asyncio.wait_for(
                client.get_workflow_handle(
                    workflow_id(job, 1), result_type=LifecycleResult
                ).result(),
                OVERALL_TIMEOUT,
            )
            assert {t.state for t in first.tiers} == {"restorable"}, first

            await start_lifecycle(
                client, LifecycleInput(checkpoint_id=two.checkpoint_id, job=job, step=2)
            )
            while True:
                assert lost_worker.alive(), lost_worker.output()
                assert loop.time() < deadline, f"copy never got under way:\n{lost_worker.output()}"
                state, done = await asyncio.to_thread(
                    replica, engine, two.checkpoint_id, LOST, "lustre"
                )
                assert state != "verified", TOO_LATE
                if state == "copying":
                    break
                await asyncio.sleep(POLL)
            assert lost_worker.kill() == -9
        state, done = await asyncio.to_thread(lost_copy, engine, two)
        assert state == "copying" and done < BIG, f"{TOO_LATE} ({state}, {done})"
        # Its copy to s3 reads the same ssd under the same limit.
        state, _ = await asyncio.to_thread(replica, engine, two.checkpoint_id, LOST, "s3")
        assert state != "verified", TOO_LATE

        async for api in running_client(create_app(settings)):
            declared = await api.post(
                f"/v1/nodes/{LOST}/lost", headers={"X-Tierpoint-Actor": "ops"}
            )
            assert declared.status_code == 200, declared.text
            body = declared.json()
            assert body["changed"] is True
            # The ssd copies of both checkpoints' shards on the lost node.
            assert body["replicas_lost"] == 2, body
            assert body["lifecycles_signalled"] == 1, body

            second = await asyncio.wait_for(
                client.get_workflow_handle(
                    workflow_id(job, 2), result_type=LifecycleResult
                ).result(),
                OVERALL_TIMEOUT,
            )
            latest = await api.get(f"/v1/jobs/{job}/checkpoints/latest")
            on_alive = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": ALIVE})

    # The lifecycle stopped waiting: lustre and s3, both copied from the nodes' ssd at once,
    # failed naming the lost node.
    outcome = {t.tier: (t.state, t.reason or "") for t in second.tiers}
    for tier in ("lustre", "s3"):
        assert outcome[tier][0] == "failed", outcome
        assert f"node {LOST} was declared lost" in outcome[tier][1], outcome
    markers_two = marker_states(engine, two.checkpoint_id)
    assert markers_two == {"ssd": "failed", "lustre": "failed", "s3": "failed"}, markers_two
    assert reasons(engine, two.checkpoint_id)["ssd"] == (
        f"node {LOST} was declared lost: its local copies are gone"
    )
    assert replica(engine, two.checkpoint_id, LOST, "ssd")[0] == "lost"
    assert replica(engine, two.checkpoint_id, ALIVE, "ssd")[0] == "verified"

    # The older checkpoint got to the durable tiers before the loss: restorable there, and
    # latest falls back to it, from lustre, for any caller.
    markers_one = marker_states(engine, one.checkpoint_id)
    assert markers_one["lustre"] == markers_one["s3"] == "restorable", markers_one
    assert markers_one["ssd"] != "restorable", markers_one
    assert latest.status_code == 200, latest.text
    assert latest.json()["step"] == 1
    assert {p["tier"] for p in latest.json()["plan"]} == {"lustre"}
    assert on_alive.json()["step"] == 1
    skipped = {s["step"]: s["reasons"] for s in latest.json()["skipped"]}
    assert 2 in skipped, latest.json()

    checked = assert_nothing_lost(settings, engine, {one.checkpoint_id: ("lustre", "s3")})
    assert checked.restorable == {"lustre": 1, "s3": 1}, checked
    # What the catalog still calls verified of the failed checkpoint is where it says it is.
    assert_catalog_matches_tiers(settings, engine, [two.checkpoint_id])
    print(f"declared: {body}; step 2: {outcome}")
