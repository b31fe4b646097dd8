"""Peer placement by failure domain on the real stack: each node worker reports its domain (the
`failure_domain` setting) with its heartbeat, and the lifecycle's plan keeps every node's peer copy
out of the node's own rack, as re-replication does after the holder is lost. Without domains the
ring would put node-a's copy on node-b, in the same rack: one rack failure would take both."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    Seeded,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Node, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id
from tierpoint.tier_config import TierConfig, TierKind

SOURCES = ("node-a", "node-b")
LIVE = (*SOURCES, "node-c", "node-d")
RACKS = {"node-a": "rack-1", "node-b": "rack-1", "node-c": "rack-2", "node-d": "rack-2"}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    ssd, *rest = settings.tiers
    peer = TierConfig(name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"))
    for node in LIVE:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nodes" / node / "peer").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {
            **settings.model_dump(),
            "tiers": [ssd, peer, *rest],
            "data_token": "tp_worker-secret-of-this-test",
            # One process serves the four nodes here: a table node -> domain.
            "failure_domain": RACKS,
        }
    )


async def test_a_nodes_peer_copy_leaves_its_rack(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = f"racks-{uuid.uuid4().hex[:10]}"
    shards = random_shards(SOURCES, 2, 32 * 1024 + 3)
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    admin = create_token(settings.database_url, scopes=["admin"])
    async with running_workers(settings, client, nodes=LIVE):
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state.value for t in result.tiers}["peer"] == "restorable", result
        with sessions() as s:
            q = select(Node.id, Node.failure_domain).where(Node.id.in_(LIVE))
            reported = {n: d for n, d in s.execute(q)}
        assert reported == RACKS
        # node-a's ring successor node-b shares its rack: the copy goes to the next rack's
        # node-c; node-b's successor node-c is in another rack already.
        _held_in(settings, sessions, seeded, {sh.path: "node-c" for sh in shards})

        # node-c is lost: re-replication places the copies again, out of rack-1 still (the ring
        # alone would put node-a's on node-b).
        async with serving(create_app(settings)) as api, httpx.AsyncClient(base_url=api) as http:
            r = await http.post("/v1/nodes/node-c/lost", headers=bearer(admin))
            assert r.status_code == 200 and r.json()["peer_rereplications"] == 1, r.text
        again = client.get_workflow_handle(rereplicate_id(job, 1))
        await asyncio.wait_for(again.result(), RESULT_TIMEOUT)
    _held_in(settings, sessions, seeded, {sh.path: "node-d" for sh in shards})


def _held_in(
    settings: Settings, sessions: sessionmaker[Session], seeded: Seeded, want: dict[str, str]
) -> None:
    """Each shard's peer copy is verified on the node `want` names, byte for byte, in another
    rack than the shard's node."""
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Replica.node_id, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == seeded.checkpoint_id, Replica.tier == "peer")
        )
        held = {p: (n, st) for p, n, st in rows}
    assert held == {p: (n, "verified") for p, n in want.items()}, held
    for sh in seeded.shards:
        node = want[sh.path]
        assert RACKS[node] != RACKS[sh.node]
        copy = shard_file(settings, "peer", node, seeded.job, seeded.step, sh.path)
        assert copy.read_bytes() == sh.data
