"""A node's data endpoint killed while a peer pulls a copy from it: the source node's worker
process (which serves the endpoint) is SIGKILLed mid-shard; the holder's copy fails over the cut
connection without taking the short read for the file, waits while the endpoint is down, and
when the node's worker is back (on a new port, reported with its heartbeat) resumes from its last
heartbeat's offset: the restarted endpoint serves only the rest of the shard, the copy is read
back from the holder's device and promoted, and the source's own copy stays verified.

Real services (Temporal dev server, Postgres), a real `tierpoint worker` process for the source
node (killed, then started again), the holder's and the shared worker in the test process.

Robust by construction, not by timing: the kill waits until the server holds a heartbeat with a
byte offset while the catalog shows the peer copy under way, and a copy that finished before the
kill fails the test with that message. The source reads at one chunk a second, so the copy takes
~8 s against a heartbeat every ~1 s."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import ShardSpec, crc_hex, markers, running_workers, seed_checkpoint
from tests.helpers.peer_faults import (
    POLL,
    copied_events,
    peer_copies,
    peer_settings,
    replica_states,
    wait_for_endpoints,
)
from tests.helpers.pending import pending_copy
from tests.helpers.services import with_tier
from tests.helpers.worker_process import worker_process
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.storage.paths import partial_name
from tierpoint.temporal import start_lifecycle

SHARD = "big.bin"
CHUNK = 8 * 1024 * 1024
SHARD_SIZE = 8 * CHUNK
# The endpoint sends through the ssd's read limiter: a chunk a second, a copy of ~8 s.
READ_LIMIT = CHUNK
HEARTBEAT_TIMEOUT = 8.0
# Guards against a hang, not a performance assertion.
OVERALL_TIMEOUT = 240.0
TOO_LATE = "the peer copy finished before the endpoint could be killed: slow it down (READ_LIMIT)"


async def test_data_endpoint_killed_mid_copy_resumes_from_the_heartbeat(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: with two live nodes each holds the other's copy.
    source, holder = f"a-{tag}", f"b-{tag}"
    base = peer_settings(
        settings, tmp_path, [source, holder], batch_heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT
    )
    slow = with_tier(base, "ssd", read_bandwidth_limit=READ_LIMIT)
    data = os.urandom(SHARD_SIZE)
    seeded = seed_checkpoint(
        base, sessions, f"peer-kill-{tag}", 7, [ShardSpec(source, SHARD, data, crc_hex(data))]
    )
    job, step = seeded.job, seeded.step
    held_dir = base.tier("peer").root_for(holder) / job / str(step)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OVERALL_TIMEOUT

    async with running_workers(base, client, nodes=[holder], shared=True):
        with worker_process(slow, source, tmp_path / "source-1.log") as first:
            first_url = (await wait_for_endpoints(sessions, [source, holder], 60))[source]
            await start_lifecycle(
                client, LifecycleInput(checkpoint_id=seeded.checkpoint_id, job=job, step=step)
            )
            handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
            while True:
                assert first.alive(), f"source worker exited:\n{first.output()}"
                assert loop.time() < deadline, f"peer copy never got under way:\n{first.output()}"
                copy = peer_copies(sessions, seeded.checkpoint_id).get(SHARD)
                assert copy is None or copy.state != "verified", TOO_LATE
                pending = await pending_copy(client, handle, "peer")
                if copy and copy.state == "copying" and copy.bytes_done and pending.offset:
                    break
                await asyncio.sleep(POLL)
            heartbeat_offset = pending.offset
            assert first.kill() == -9, first.output()

        # The endpoint is gone: the holder has the shard only under its temp name.
        copy = peer_copies(sessions, seeded.checkpoint_id)[SHARD]
        assert copy.state == "copying", f"{TOO_LATE} ({copy})"
        assert 0 < heartbeat_offset < SHARD_SIZE, TOO_LATE
        assert os.listdir(held_dir) == [partial_name(SHARD)]
        # The holder keeps trying the dead endpoint meanwhile (attempt 2 or later), and none of
        # its tries takes the cut body for the file.
        while (pending := await pending_copy(client, handle, "peer")).attempt < 2:
            assert loop.time() < deadline, "the copy was not retried after the endpoint died"
            await asyncio.sleep(POLL)
        assert replica_states(sessions, seeded.checkpoint_id, "ssd") == ["verified"]

        fast = base.model_copy(update={"log_level": "DEBUG"})
        with worker_process(fast, source, tmp_path / "source-2.log") as second:
            await wait_for_endpoints(sessions, [source], 60, not_=first_url)
            result_task = asyncio.ensure_future(handle.result())
            try:
                while not result_task.done():
                    assert second.alive(), f"source worker exited:\n{second.output()}"
                    assert loop.time() < deadline, f"lifecycle did not finish:\n{second.output()}"
                    await asyncio.wait({result_task}, timeout=POLL)
                result = result_task.result()
            finally:
                result_task.cancel()
            served = second.log.read_text(errors="replace")

    assert isinstance(result, LifecycleResult)
    assert [(t.tier, t.state) for t in result.tiers] == [
        ("ssd", "restorable"),
        ("peer", "restorable"),
    ], markers(sessions, seeded.checkpoint_id)
    # The source's copy was never taken for a bad one: the cut connection was the network's.
    assert replica_states(sessions, seeded.checkpoint_id, "ssd") == ["verified"]
    copy = peer_copies(sessions, seeded.checkpoint_id)[SHARD]
    assert (copy.node, copy.state) == (holder, "verified")
    assert os.listdir(held_dir) == [SHARD]
    # On the holder's device, whole, with the registered crc32c; the source's copy too.
    checked = assert_catalog_matches_tiers(base, engine, [seeded.checkpoint_id])
    assert checked.verified == {"ssd": 1, "peer": 1}, checked

    # One copy reported, by a later attempt, resumed where the killed pull's heartbeat was.
    (copied,) = copied_events(sessions, seeded.checkpoint_id, "peer")
    assert copied["attempt"] >= 2
    (resumed,) = copied["resumed"]
    assert resumed["path"] == SHARD
    offset = int(resumed["offset"])
    assert offset >= heartbeat_offset > 0
    assert copied["bytes"] == SHARD_SIZE - offset
    # And the restarted endpoint sent only that rest, once.
    sent = [
        int(m.group(1))
        for line in served.splitlines()
        if " served " in line and SHARD in line and (m := re.search(r"bytes=(\d+)", line))
    ]
    assert sent == [SHARD_SIZE - offset], served[-2000:]
    print(
        f"killed at heartbeat offset {heartbeat_offset}; resumed at {offset} on attempt "
        f"{copied['attempt']}; the restarted endpoint served {sent} bytes"
    )
