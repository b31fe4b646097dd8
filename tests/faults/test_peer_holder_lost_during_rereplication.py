"""A node lost while the peer copies of another lost node are being made again on it: node A's
shard is held by B; B is declared lost, and re-replication copies A's shard to C, the node after
A among the live ones; C dies (SIGKILL) mid-copy and is declared lost too. The running
re-replication is told, gives the copy to C up at once (no worker will serve C's queue again),
and plans again: the shard is copied to D, verified, and the peer tier promoted again, with one
copy on a live node. Throughout, the tier is never restorable while its shard lacks a verified
copy on a live node, and "latest restorable" never offers a copy on B or C.

Real services (Temporal dev server, Postgres, the API in the test process), real `tierpoint
worker` processes for A (the source, its endpoint slowed so the copy to C is caught mid-way) and
C (killed); B's, D's and the shared worker in the test process."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import (
    ShardSpec,
    crc_hex,
    markers,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import POLL, peer_copies, peer_settings, wait_for_endpoints
from tests.helpers.services import with_tier
from tests.helpers.tokens import bearer, create_token
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.models import Node, Replica
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

SHARD = "rank0.bin"
CHUNK = 8 * 1024 * 1024
SIZE = 6 * CHUNK
# A's endpoint sends a chunk a second: each copy of the shard takes ~6 s.
READ_LIMIT = CHUNK
HEARTBEAT_TIMEOUT = 8.0
# Guards against a hang, not a performance assertion. Without the loss reaching the running
# re-replication, its copy to C is retried on C's queue, which no worker serves, far longer.
REREPLICATION_TIMEOUT = 150.0
TOO_LATE = "the copy to C finished before C could be killed: slow A's endpoint (READ_LIMIT)"


def verified_on_live_nodes(sessions: sessionmaker[Session], checkpoint_id: int) -> bool:
    """Whether the shard has a verified peer copy on a node not declared lost."""
    with sessions() as s:
        return bool(
            s.scalar(
                select(Replica.id)
                .join(Node, Node.id == Replica.node_id)
                .where(
                    Replica.checkpoint_id == checkpoint_id,
                    Replica.tier == "peer",
                    Replica.state == "verified",
                    Node.lost_at.is_(None),
                )
            )
        )


async def offered_peer_nodes(http: httpx.AsyncClient, job: str) -> set[str] | None:
    """The nodes whose peer copies "latest restorable" offers now; None when it offers none."""
    r = await http.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "peer"})
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return {e["node"] for e in r.json()["plan"]}


async def test_a_new_holder_lost_mid_rereplication_is_replaced(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: a -> b -> c -> d -> a.
    a, b, c, d = (f"{tag}-{x}" for x in "abcd")
    base = peer_settings(
        settings, tmp_path, [a, b, c, d], batch_heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT
    )
    slow = with_tier(base, "ssd", read_bandwidth_limit=READ_LIMIT)
    data = os.urandom(SIZE)
    seeded = seed_checkpoint(
        base, sessions, f"relost-{tag}", 5, [ShardSpec(a, SHARD, data, crc_hex(data))]
    )
    cid, job = seeded.checkpoint_id, seeded.job
    admin = create_token(base.database_url, scopes=["admin"])
    loop = asyncio.get_running_loop()

    async with (
        running_workers(base, client, nodes=[b, d], shared=True),
        serving(create_app(base)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        with (
            worker_process(slow, a, tmp_path / "a.log") as a_worker,
            worker_process(base, c, tmp_path / "c.log") as c_worker,
        ):
            await wait_for_endpoints(sessions, [a, b, c, d], 60)
            result, _ = await run_lifecycle(client, seeded)
            assert {t.tier: t.state for t in result.tiers}["peer"] == "restorable"
            assert peer_copies(sessions, cid)[SHARD].node == b
            assert await offered_peer_nodes(http, job) == {b}

            r = await http.post(f"/v1/nodes/{b}/lost")
            assert r.status_code == 200 and r.json()["peer_rereplications"] == 1, r.text
            first_run = (await client.get_workflow_handle(rereplicate_id(job, 5)).describe()).run_id
            deadline = loop.time() + REREPLICATION_TIMEOUT
            while True:
                copy = peer_copies(sessions, cid)[SHARD]
                assert copy.node != c or copy.state != "verified", TOO_LATE
                if (copy.node, copy.state) == (c, "copying") and copy.bytes_done > 0:
                    break
                assert loop.time() < deadline, f"no copy to {c} under way: {copy}"
                assert await offered_peer_nodes(http, job) is None
                await asyncio.sleep(POLL)
            # C dies mid-copy, and the operator declares it lost.
            assert c_worker.kill() == -9, c_worker.output()
            r = await http.post(f"/v1/nodes/{c}/lost")
            assert r.status_code == 200 and r.json()["peer_rereplications"] == 1, r.text

            again = asyncio.ensure_future(
                client.get_workflow_handle(rereplicate_id(job, 5)).result()
            )
            try:
                while not again.done():
                    assert a_worker.alive(), a_worker.output()
                    assert loop.time() < deadline, (
                        f"re-replication did not end after {c} was lost: "
                        f"{peer_copies(sessions, cid)}, {markers(sessions, cid)}"
                    )
                    # Never restorable from a lost copy, never a lost copy offered.
                    if markers(sessions, cid)["peer"][0] == "restorable":
                        assert verified_on_live_nodes(sessions, cid)
                    assert (await offered_peer_nodes(http, job) or set()).isdisjoint({b, c})
                    await asyncio.wait({again}, timeout=0.5)
                again.result()
            finally:
                again.cancel()
            offered = await offered_peer_nodes(http, job)
            if recording_histories():
                # The run told of C's loss mid-copy, which continued as new.
                await record_history(
                    client, rereplicate_id(job, 5), "peer_rereplicate_holder_lost", first_run
                )

    state = markers(sessions, cid)
    assert state["peer"][0] == "restorable", state
    copy = peer_copies(sessions, cid)[SHARD]
    assert (copy.node, copy.state) == (d, "verified"), copy
    assert offered == {d}
    # On D's device, whole, with the registered crc32c; nothing verified on B or C.
    checked = assert_catalog_matches_tiers(base, engine, [cid])
    assert checked.verified == {"ssd": 1, "peer": 1} and checked.restorable["peer"] == 1, checked
    print(f"peer copy of {SHARD}: {b} lost, {c} lost mid-copy, now on {d}; marker {state['peer']}")
