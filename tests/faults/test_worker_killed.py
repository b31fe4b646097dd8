"""A node worker process SIGKILLed in the middle of a copy loses nothing: the copy resumes on a
new worker process from the killed attempt's last heartbeat (only the rest of the shard is read
again), no partial file is ever seen under the shard's final name, every tier ends restorable with
the original bytes, and the catalog agrees with every tier.

Real services (Temporal dev server, Postgres, moto S3), a real `tierpoint worker` process for the
node, the shared worker (workflows, lustre -> s3) in the test process.

Robust by construction, not by timing: the kill waits until the Temporal server holds a heartbeat
with a byte offset (so there is a resume point) while the catalog still shows the copy under way,
and everything after the kill checks that the copy had not finished; a copy that ends before the
kill fails the test with that message instead of passing or flaking. The throttle gives one
heartbeat per ~1 s of copy against a heartbeat timeout of 8 s, so a live worker on a busy machine
is never taken for a dead one."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client

from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import ShardSpec, crc_hex, new_job, running_workers, seed_checkpoint
from tests.helpers.pending import pending_copy
from tests.helpers.services import Services, s3_client
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.models import Event, Replica
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.storage.paths import partial_name
from tierpoint.temporal import start_lifecycle

SHARD = "big.bin"
CHUNK = 8 * 1024 * 1024  # a POSIX copy heartbeats once per chunk
SHARD_SIZE = 8 * CHUNK
# Reads off the node's ssd at one chunk a second: a heartbeat every ~1 s of copy, and a copy of
# ~8 s, of which the kill takes the first few (the first heartbeat with an offset reaches the
# server one heartbeat throttle interval after the first, a third of the timeout: ~3 s). The
# second worker process reads at full speed: only the first one has to be slow enough to be
# caught mid-copy.
READ_LIMIT = CHUNK
# How long Temporal waits for a killed worker's heartbeat before retrying the batch elsewhere:
# 8 heartbeat intervals, so a live worker stalled for seconds on a busy machine keeps its attempt.
HEARTBEAT_TIMEOUT = 8.0
# Guards against a hang, not a performance assertion.
OVERALL_TIMEOUT = 180.0
POLL = 0.2
TOO_LATE = "the copy finished before the worker could be killed: slow it down (READ_LIMIT)"


def lustre_replica(sessions: sessionmaker[Session], checkpoint_id: int) -> tuple[str | None, int]:
    with sessions() as s:
        row = s.execute(
            select(Replica.state, Replica.bytes_done).where(
                Replica.checkpoint_id == checkpoint_id, Replica.tier == "lustre"
            )
        ).one_or_none()
    return (str(row[0]), int(row[1] or 0)) if row else (None, 0)


def assert_no_partial_under_final_name(final: Path, size: int) -> None:
    """The final name appears only by an atomic rename of a complete, fsynced temp file."""
    try:
        seen = final.stat().st_size
    except FileNotFoundError:
        return
    assert seen == size, f"{final.name} seen with {seen} of {size} bytes"


def s3_bytes(settings: Settings, services: Services, job: str, step: int, path: str) -> bytes:
    tier = settings.tier("s3")
    assert tier.bucket is not None
    s3 = s3_client(services)
    body: bytes = s3.get_object(Bucket=tier.bucket, Key=f"{tier.prefix}{job}/{step}/{path}")[
        "Body"
    ].read()
    return body


async def test_node_worker_sigkilled_mid_copy_resumes_from_last_heartbeat(
    settings: Settings,
    services: Services,
    engine: Engine,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
) -> None:
    node = f"node-{uuid.uuid4().hex[:10]}"
    ssd = settings.tier("ssd").model_copy(update={"read_bandwidth_limit": READ_LIMIT})
    ssd.root_for(node).mkdir(parents=True)
    slow = settings.model_copy(
        update={
            "tiers": [ssd, *settings.tiers[1:]],
            "batch_heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT,
        }
    )
    data = os.urandom(SHARD_SIZE)
    seeded = seed_checkpoint(
        slow, sessions, new_job(), 7, [ShardSpec(node, SHARD, data, crc_hex(data))]
    )
    job, step = seeded.job, seeded.step
    lustre_dir = slow.tier("lustre").root_for(None) / job / str(step)
    final = lustre_dir / SHARD
    await start_lifecycle(
        client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step)
    )
    handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OVERALL_TIMEOUT

    async with running_workers(slow, client, nodes=[], shared=True):
        with worker_process(slow, node, tmp_path / "node-worker-1.log") as first:
            # Wait until the catalog shows the copy under way and the server holds a heartbeat
            # with an offset to resume from; then kill at once.
            heartbeats: set[float] = set()
            while True:
                assert first.alive(), f"node worker exited:\n{first.output()}"
                assert loop.time() < deadline, f"copy never got under way:\n{first.output()}"
                assert_no_partial_under_final_name(final, SHARD_SIZE)
                state, done = lustre_replica(sessions, seeded.checkpoint_id)
                assert state != "verified", TOO_LATE
                pending = await pending_copy(client, handle, "lustre")
                if pending.heartbeat_at:
                    heartbeats.add(pending.heartbeat_at)
                heartbeat_offset = pending.offset
                if state == "copying" and done > 0 and heartbeat_offset > 0:
                    break
                await asyncio.sleep(POLL)
            status = first.kill()
            killed_at = time.monotonic()
        assert status == -9, first.output()

        # The worker is dead: the copy stands where it was, only under the temp name.
        state, done_when_dead = lustre_replica(sessions, seeded.checkpoint_id)
        assert state == "copying", f"{TOO_LATE} (lustre replica {state})"
        assert 0 < done_when_dead < SHARD_SIZE, f"{TOO_LATE} ({done_when_dead} bytes done)"
        assert heartbeat_offset < SHARD_SIZE, TOO_LATE
        assert sorted(os.listdir(lustre_dir)) == [partial_name(SHARD)]
        partial_size = (lustre_dir / partial_name(SHARD)).stat().st_size
        assert heartbeat_offset <= partial_size <= SHARD_SIZE

        fast = slow.model_copy(update={"tiers": settings.tiers})
        with worker_process(fast, node, tmp_path / "node-worker-2.log") as second:
            result_task = asyncio.ensure_future(handle.result())
            resumed_at: float | None = None
            try:
                while not result_task.done():
                    assert second.alive(), f"node worker exited:\n{second.output()}"
                    assert loop.time() < deadline, f"lifecycle did not finish:\n{second.output()}"
                    assert_no_partial_under_final_name(final, SHARD_SIZE)
                    if resumed_at is None:
                        pending = await pending_copy(client, handle, "lustre")
                        if (
                            pending.attempt >= 2
                            and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                        ):
                            resumed_at = time.monotonic()
                    await asyncio.wait({result_task}, timeout=POLL)
                result = result_task.result()
            finally:
                result_task.cancel()
            done_at = time.monotonic()

    assert isinstance(result, LifecycleResult)
    assert [(t.tier, t.state) for t in result.tiers] == [
        ("ssd", "restorable"),
        ("lustre", "restorable"),
        ("s3", "restorable"),
    ]
    # Every tier holds the original bytes, and lustre nothing but the committed shard.
    assert (ssd.root_for(node) / job / str(step) / SHARD).read_bytes() == data
    assert final.read_bytes() == data
    assert sorted(os.listdir(lustre_dir)) == [SHARD]
    assert s3_bytes(slow, services, job, step, SHARD) == data
    checked = assert_catalog_matches_tiers(slow, engine, [seeded.checkpoint_id])
    assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}

    with sessions() as s:
        copied = [
            d
            for (d,) in s.execute(
                select(Event.detail)
                .where(
                    Event.checkpoint_id == seeded.checkpoint_id,
                    Event.kind == "copied",
                    Event.tier == "lustre",
                )
                .order_by(Event.id)
            )
        ]
    # The killed attempt never reported; the retry resumed from the last heartbeat it saw.
    assert len(copied) == 1
    assert copied[0]["attempt"] >= 2
    resumed = copied[0]["resumed"]
    assert [r["path"] for r in resumed] == [SHARD]
    assert resumed[0]["offset"] >= heartbeat_offset > 0
    # Only what was left was read again.
    assert copied[0]["bytes"] == SHARD_SIZE - resumed[0]["offset"]

    gaps = [b - a for a, b in zip(sorted(heartbeats), sorted(heartbeats)[1:], strict=False)]
    print(
        f"server heartbeats before the kill: {len(heartbeats)}, largest gap seen "
        f"{max(gaps, default=0.0):.1f} s (timeout {HEARTBEAT_TIMEOUT:g} s); "
        f"killed at heartbeat offset {heartbeat_offset} (catalog bytes_done {done_when_dead}, "
        f"partial {partial_size}); retry resumed at {resumed[0]['offset']}; "
        f"kill -> attempt {copied[0]['attempt']} started: "
        f"{'?' if resumed_at is None else f'{resumed_at - killed_at:.1f}'} s; "
        f"kill -> lifecycle done: {done_at - killed_at:.1f} s"
    )
