"""`PeerRereplicate` (workflows/peer.py). A node and the holder of its peer copy both lost: the
peer copy is made again from the tier below that holds the shards verified (the shared tier, else
S3) onto a new holder chosen by placement, read back from that holder's device, and the peer tier
promoted again. With no tier below holding them, the tier stays failed and the failures view says
why.

Real services (Temporal dev server, Postgres, moto, the API in the test process); the nodes'
workers and the shared worker in the test process, over real data endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    markers,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import copied_events, peer_copies, peer_settings, wait_for_endpoints
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Replica, Shard, TierCopy
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id
from tierpoint.states import ReplicaState, TierState

SIZE = 64 * 1024 + 3


async def _lose(http: httpx.AsyncClient, node: str) -> int:
    r = await http.post(f"/v1/nodes/{node}/lost")
    assert r.status_code == 200, r.text
    return int(r.json()["peer_rereplications"])


async def test_a_lost_nodes_shards_are_copied_again_from_the_tiers_below(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: a -> b -> c -> d -> a.
    a, b, c, d = (f"{tag}-{x}" for x in "abcd")
    base = peer_settings(settings, tmp_path, [a, b, c, d], later=True)
    shards = random_shards([a, b], 2, SIZE)
    seeded = seed_checkpoint(base, sessions, f"below-{tag}", 3, shards)
    cid, job = seeded.checkpoint_id, seeded.job
    on_a = [sh.path for sh in shards if sh.node == a]
    admin = create_token(base.database_url, scopes=["admin"])
    async with (
        running_workers(base, client, nodes=[a, b, c, d], shared=True),
        serving(create_app(base)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, [a, b, c, d], 60)
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state for t in result.tiers} == dict.fromkeys(
            ("ssd", "peer", "lustre", "s3"), "restorable"
        )
        assert {peer_copies(sessions, cid)[p].node for p in on_a} == {b}
        # One of a's shards is bad on the shared tier (a scrub marks and demotes it): S3 holds it.
        with sessions.begin() as s:
            s.execute(
                update(Replica)
                .where(
                    Replica.tier == "lustre",
                    Replica.shard_id.in_(
                        select(Shard.id).where(Shard.checkpoint_id == cid, Shard.path == on_a[1])
                    ),
                )
                .values(state=ReplicaState.CORRUPT.value)
            )
            s.execute(
                update(TierCopy)
                .where(TierCopy.checkpoint_id == cid, TierCopy.tier == "lustre")
                .values(state=TierState.FAILED.value, reason="1 corrupt replica found by scrub")
            )
        # a is lost: its peer copies on b stay restorable. Then b, their holder, is lost too.
        assert await _lose(http, a) == 0
        assert markers(sessions, cid)["peer"][0] == "restorable"
        assert await _lose(http, b) == 1
        await asyncio.wait_for(
            client.get_workflow_handle(rereplicate_id(job, 3)).result(), RESULT_TIMEOUT
        )
        if recording_histories():
            # Batches read from the shared tier and S3, on a holder, for a lost node's shards.
            await record_history(client, rereplicate_id(job, 3), "peer_rereplicate_from_below")
    state = markers(sessions, cid)
    assert state["peer"] == ("restorable", None), state
    copies = peer_copies(sessions, cid)
    # a's shards on a new holder (placement's: the live ring c, d), b's still on c.
    for p in on_a:
        assert copies[p].state == "verified" and copies[p].node in {c, d}, copies
    sources = {e["source"] for e in copied_events(sessions, cid, "peer") if e["source"] != "ssd"}
    assert sources == {"lustre", "s3"}, copied_events(sessions, cid, "peer")
    # Every verified copy on its device, byte for byte, a peer copy on its live holder.
    checked = assert_catalog_matches_tiers(base, engine, [cid])
    assert checked.verified["peer"] == len(shards) and checked.restorable["peer"] == 1


async def test_with_no_tier_below_the_peer_tier_stays_failed_and_says_why(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b, c = (f"{tag}-{x}" for x in "abc")
    base = peer_settings(settings, tmp_path, [a, b, c])  # ssd -> peer: nothing below
    seeded = seed_checkpoint(base, sessions, f"nobelow-{tag}", 4, random_shards([a], 1, SIZE))
    cid, job = seeded.checkpoint_id, seeded.job
    admin = create_token(base.database_url, scopes=["admin"])
    async with (
        running_workers(base, client, nodes=[a, b, c], shared=True),
        serving(create_app(base)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, [a, b, c], 60)
        await run_lifecycle(client, seeded)
        assert markers(sessions, cid)["peer"][0] == "restorable"
        assert await _lose(http, a) == 0
        assert await _lose(http, b) == 1
        await asyncio.wait_for(
            client.get_workflow_handle(rereplicate_id(job, 4)).result(), RESULT_TIMEOUT
        )
        r = await http.get("/v1/failures", params={"job": job})
        assert r.status_code == 200, r.text
        failures = {f["tier"]: f["reason"] for f in r.json()["items"]}
    state, reason = markers(sessions, cid)["peer"]
    assert state == "failed", reason
    why = "1 shard(s) that no other tier holds verified on a live node"
    assert reason is not None and why in reason, reason
    assert why in (failures.get("peer") or ""), failures
