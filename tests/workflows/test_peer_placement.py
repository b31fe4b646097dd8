"""Peer placement by failure domain on the real stack: each node worker reports its domain (the
`failure_domain` setting) with its heartbeat, and the lifecycle's plan keeps every node's peer copy
out of the node's own rack. Without domains the ring would put node-a's copy on node-b, in the
same rack: one rack failure would take both."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import (
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tierpoint.catalog.models import Node, Replica, Shard
from tierpoint.config import Settings, TierConfig, TierKind

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
    async with running_workers(settings, client, nodes=LIVE):
        result, _ = await run_lifecycle(client, seeded)
    assert {t.tier: t.state.value for t in result.tiers}["peer"] == "restorable", result
    with sessions() as s:
        q = select(Node.id, Node.failure_domain).where(Node.id.in_(LIVE))
        reported = {n: d for n, d in s.execute(q)}
        rows = s.execute(
            select(Shard.path, Replica.node_id)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == seeded.checkpoint_id, Replica.tier == "peer")
        )
        held: dict[str, str] = {p: n for p, n in rows if n is not None}
    assert reported == RACKS
    # node-a's ring successor node-b shares its rack: the copy goes to the next rack's node-c;
    # node-b's successor node-c is in another rack already.
    for sh in shards:
        assert held[sh.path] == "node-c", (sh.node, held)
        assert RACKS[held[sh.path]] != RACKS[sh.node]
        assert shard_file(settings, "peer", "node-c", job, 1, sh.path).read_bytes() == sh.data
