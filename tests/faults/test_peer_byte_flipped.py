"""A byte flipped in transit between a node's data endpoint and the peer pulling a copy from it:
a real proxy process in front of the endpoint (the node advertises the proxy's address) flips one
bit in the middle of a response body. The copy's crc32c, computed in the same pass as the write,
catches it: the damaged copy is never verified nor promoted, and the shard is read again whole.
Damaged once, the second read (clean) is verified and the peer tier promoted; damaged on every
read, the copy is given up with a reason that says so and the peer tier is not restorable. In
both cases the source's own copy, whose bytes are fine, stays verified and restorable: a flip on
the network is not the source's fault.

Real services (Temporal dev server, Postgres), a real `tierpoint worker` process for the source
node behind the real proxy process, the holder's and the shared worker in the test process."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from activities.copy import REREADS_AFTER_TRANSIT_MISMATCH
from apps.devstack.services import free_port
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.flip_proxy import flip_proxy
from tests.helpers.lifecycle import (
    ShardSpec,
    crc_hex,
    markers,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import (
    copied_events,
    peer_copies,
    peer_settings,
    replica_states,
    wait_for_endpoints,
)
from tests.helpers.worker_process import worker_process
from tierpoint.config import Settings

SHARD = "model.bin"
SIZE = 3 * 1024 * 1024 + 7
# Every read of the shard damaged: the first and its re-reads.
READS = 1 + REREADS_AFTER_TRANSIT_MISMATCH


@pytest.mark.parametrize("flips", [1, -1], ids=["once", "every-read"])
async def test_a_byte_flipped_in_transit_is_never_promoted(
    flips: int,
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # The module's catalog outlives a test: the same two nodes in each keep the ring the same.
    source, holder = "flip-a", "flip-b"
    base = peer_settings(settings, tmp_path, [source, holder])
    data = os.urandom(SIZE)
    seeded = seed_checkpoint(
        base, sessions, f"flip-{tag}", 3, [ShardSpec(source, SHARD, data, crc_hex(data))]
    )
    port = free_port()
    with flip_proxy(f"127.0.0.1:{port}", flips) as proxy:
        behind = base.model_copy(update={"data_port": port, "data_url": proxy.url})
        async with running_workers(base, client, nodes=[holder], shared=True):
            with worker_process(behind, source, tmp_path / "source.log") as worker:
                urls = await wait_for_endpoints(sessions, [source, holder], 60)
                assert urls[source] == proxy.url
                result, _ = await run_lifecycle(client, seeded)
                assert worker.alive(), worker.output()
        seen = proxy.stats()

    tiers = {t.tier: t.state for t in result.tiers}
    state = markers(sessions, seeded.checkpoint_id)
    # The source's copy is fine whatever the network did to what was read of it.
    assert tiers["ssd"] == "restorable", state
    assert replica_states(sessions, seeded.checkpoint_id, "ssd") == ["verified"]
    copy = peer_copies(sessions, seeded.checkpoint_id)[SHARD]
    held = base.tier("peer").root_for(holder) / seeded.job / str(seeded.step)
    (copied,) = copied_events(sessions, seeded.checkpoint_id, "peer")
    rereads = copied.get("recopied", [])
    assert all(r["path"] == SHARD and "over the network" in r["reason"] for r in rereads)
    if flips == 1:
        assert seen["flipped"] == 1 and seen["responses"] == 2, seen
        assert tiers["peer"] == "restorable", state
        assert (copy.node, copy.state) == (holder, "verified")
        assert len(rereads) == 1
    else:
        assert seen["flipped"] == seen["responses"] == READS, seen
        assert tiers["peer"] == "failed", state
        assert state["peer"][0] == "failed" and state["peer"][1], state
        assert copy.state == "corrupt", copy
        assert copy.error and "no read of ssd over the network matched" in copy.error, copy
        # Nothing of the damaged copies is left on the holder, under any name.
        assert not held.exists() or os.listdir(held) == []
        assert len(rereads) == READS
    # The catalog against the bytes: the source's copy, and the holder's when it was verified.
    checked = assert_catalog_matches_tiers(base, engine, [seeded.checkpoint_id])
    assert checked.verified == ({"ssd": 1, "peer": 1} if flips == 1 else {"ssd": 1}), checked
    print(f"flips={flips}: proxy {seen}; peer copy {copy.state}; marker {state['peer']}")
