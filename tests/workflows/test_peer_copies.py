"""`copies = 2` on one configured peer tier, on the real stack: the settings make it the peer
tiers `peer` and `peer.2`, and each node's shards get two verified copies, on two distinct nodes
other than their own (the first and second holders of the node's placement), each under its own
root, listed by `GET /v1/tiers` as copies 1 and 2 of `peer`, and each restorable on its own."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import (
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Replica, Shard
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

SOURCES = ("node-a", "node-b")
# The ring a -> b -> c -> a: node-a's copies go to b then c, node-b's to c then a.
LIVE = (*SOURCES, "node-c")
HOLDERS = {
    "peer": {"node-a": "node-b", "node-b": "node-c"},
    "peer.2": {"node-a": "node-c", "node-b": "node-a"},
}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """ssd -> peer (copies = 2): the shared and S3 tiers add nothing to what is shown here."""
    ssd = settings.tiers[0]
    peer = TierConfig(
        name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"), copies=2
    )
    for node in LIVE:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, peer], "data_token": "tp_worker-secret-of-copies"}
    )


def _held(
    sessions: sessionmaker[Session], checkpoint_id: int
) -> dict[tuple[str, str], tuple[str | None, str]]:
    """(tier, path) -> (holding node, state) of each shard's peer copies."""
    with sessions() as s:
        rows = s.execute(
            select(Replica.tier, Shard.path, Replica.node_id, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id, Replica.tier.like("peer%"))
        )
        return {(t, p): (n, st) for t, p, n, st in rows}


async def test_a_peer_tier_with_two_copies_keeps_each_shard_on_two_other_nodes(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    assert settings.tier_names() == ["ssd", "peer", "peer.2"]
    job = f"copies-{uuid.uuid4().hex[:10]}"
    shards = random_shards(SOURCES, 1, 64 * 1024 + 5)
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    reader = create_token(settings.database_url, scopes=[f"train:{job}"])
    admin = create_token(settings.database_url, scopes=["admin"])
    async with running_workers(settings, client, nodes=LIVE):
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state.value for t in result.tiers} == {
            "ssd": "restorable",
            "peer": "restorable",
            "peer.2": "restorable",
        }, result
        async with serving(create_app(settings)) as api:
            async with httpx.AsyncClient(base_url=api) as http:
                r = await http.get("/v1/tiers", headers=bearer(admin))
            assert r.status_code == 200, r.text
            shown = [(t["name"], t["copies"], t["copy_of"], t["copy_number"]) for t in r.json()]
            assert shown == [
                ("ssd", 1, None, None),
                ("peer", 2, "peer", 1),
                ("peer.2", 2, "peer", 2),
            ]
            # Each copy alone restores the checkpoint, through its holders' data endpoints.
            restored = {
                tier: TierpointClient(api, token=reader).restore(
                    job, tmp_path / "restore" / tier, tier=tier
                )
                for tier in HOLDERS
            }

    held = _held(sessions, seeded.checkpoint_id)
    assert held == {
        (tier, sh.path): (HOLDERS[tier][sh.node], "verified") for tier in HOLDERS for sh in shards
    }
    for sh in shards:
        first, second = HOLDERS["peer"][sh.node], HOLDERS["peer.2"][sh.node]
        assert len({sh.node, first, second}) == 3
        for tier, holder in (("peer", first), ("peer.2", second)):
            copy = shard_file(settings, tier, holder, job, 1, sh.path)
            assert copy.read_bytes() == sh.data
        # The second copy lives under the root `<root>.2`, apart from the first.
        assert shard_file(settings, "peer.2", second, job, 1, sh.path).is_relative_to(
            tmp_path / "nodes" / second / "peer.2"
        )
    for tier, done in restored.items():
        assert done.step == 1
        assert {f.path: f.tier for f in done.files} == {sh.path: tier for sh in shards}
        for sh in shards:
            assert (tmp_path / "restore" / tier / sh.path).read_bytes() == sh.data
    checked = assert_catalog_matches_tiers(settings, engine, [seeded.checkpoint_id])
    assert checked.restorable["peer"] == 1 and checked.restorable["peer.2"] == 1, checked
