"""Scrub, reconciliation and repair of peer copies, on the real stack: the copy a node holds for
another node is read back on the holder, scanned in the holder's peer root, and copied again onto
the holder from the shard's node's local copy (over that node's data endpoint).

One bit of a peer copy rots: the scrub's unit for the holder finds it, marks it corrupt and
demotes the peer tier, and the repair it asks for pulls the shard again onto the same holder. A
peer file is deleted: reconciliation of the peer tier finds it missing on its holder, marks it
lost, and repair puts it back. The operator views show the copy on its holder throughout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import OVERALL_TIMEOUT, marker_states
from tests.helpers.integrity import (
    events,
    integrity_settings,
    promoted,
    repair_result,
    replica_states,
    run_reconcile,
    run_scrub,
)
from tests.helpers.lifecycle import (
    NODES,
    Seeded,
    ShardSpec,
    running_workers,
    shard_file,
)
from tests.helpers.services import Services
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileInput
from tierpoint.tier_config import TierConfig, TierKind

# Two nodes: each holds the other's peer copies.
RING = {NODES[0]: NODES[1], NODES[1]: NODES[0]}
TIERS = ("ssd", "peer", "lustre", "s3")


@pytest.fixture
def cfg(settings: Settings, tmp_path: Path) -> Settings:
    """The peer tier after ssd; only it is scrubbed, so the scrub's findings are its own."""
    ssd, *rest = integrity_settings(settings).tiers
    peer = TierConfig(
        name="peer",
        kind=TierKind.PEER,
        root=str(tmp_path / "nodes/{node}/peer"),
        scrub_bandwidth=1 << 30,
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "peer").mkdir(parents=True, exist_ok=True)
    quiet = [t.model_copy(update={"scrub_bandwidth": 0}) for t in rest]
    return Settings.model_validate(
        {
            **integrity_settings(settings).model_dump(),
            "tiers": [ssd, peer, *quiet],
            "data_token": "tp_worker-secret-of-this-test",
        }
    )


def _peer_copy(cfg: Settings, seeded: Seeded, sh: ShardSpec) -> Path:
    return shard_file(cfg, "peer", RING[sh.node], seeded.job, seeded.step, sh.path)


def _flip(path: Path, at: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


async def _verify(api: httpx.AsyncClient, seeded: Seeded, tier: str) -> dict[str, Any]:
    """`POST .../verify`'s outcome once its run completed (asking again joins the run)."""
    url = f"/v1/jobs/{seeded.job}/checkpoints/{seeded.step}/verify"
    async with asyncio.timeout(OVERALL_TIMEOUT):
        while True:
            r = await api.post(url, json={"tier": tier})
            assert r.status_code == 202, r.text
            body = r.json()
            if body["status"] != "running":
                assert body["status"] == "completed", body
                outcome: dict[str, Any] = body["outcome"]
                return outcome


def _holders(engine: Engine, checkpoint_id: int) -> dict[str, tuple[str | None, str]]:
    """shard path -> (node its peer replica names, state)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Shard.path, Replica.node_id, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id, Replica.tier == "peer")
        ).all()
    return {p: (n, st) for p, n, st in rows}


def _healed(cfg: Settings, engine: Engine, seeded: Seeded) -> None:
    """Every tier restorable again, every peer copy verified on its holder, byte for byte."""
    assert marker_states(engine, seeded.checkpoint_id) == dict.fromkeys(TIERS, "restorable")
    held = _holders(engine, seeded.checkpoint_id)
    for sh in seeded.shards:
        assert held[sh.path] == (RING[sh.node], "verified")
        assert not shard_file(cfg, "peer", sh.node, seeded.job, seeded.step, sh.path).exists()
    # Each tier's bytes against the catalog: the peer copies read on their holders.
    checked = assert_catalog_matches_tiers(cfg, engine, [seeded.checkpoint_id])
    assert checked.verified["peer"] == len(seeded.shards), checked
    assert checked.restorable == dict.fromkeys(TIERS, 1), checked


async def test_scrub_finds_a_rotten_peer_copy_on_its_holder_and_repair_recopies_it(
    cfg: Settings, services: Services, client: Client
) -> None:
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        async with running_workers(cfg, client):
            seeded = await promoted(cfg, client, engine, workers=False)
            cp = seeded.checkpoint_id
            rotten = seeded.shards[0]
            copy = _peer_copy(cfg, seeded, rotten)
            _flip(copy)

            result = await run_scrub(client, f"scrub-test/{seeded.job}")
            assert result.corrupt == 1, result
            # One unit per holder, each reading the copies it holds for the other node.
            assert result.units == len(NODES), result
            assert result.replicas == len(seeded.shards) - 1, result
            repaired = await repair_result(client, seeded)
        assert {t.tier: t.state for t in repaired.tiers} == {"peer": "restorable"}, repaired
        _healed(cfg, engine, seeded)
        kinds = [(k, t) for k, t, _ in events(engine, cp, "corrupt", "repaired", "promoted")]
        assert [k for k, t in kinds if t == "peer"] == [
            "promoted",
            "corrupt",
            "repaired",
            "promoted",
        ]
        (repair,) = [d for k, t, d in events(engine, cp, "repaired") if t == "peer"]
        # From the shard's node's local copy, over its data endpoint.
        assert repair["sources"] == {"ssd": 1} and repair["node"] == rotten.node, repair

        async for api in running_client(create_app(cfg)):
            r = await api.get("/v1/scrub")
            assert r.status_code == 200, r.text
            peer = {t["tier"]: t for t in r.json()["tiers"]}["peer"]
            assert peer["corrupt"] == 1 and peer["replicas"] == len(seeded.shards) - 1, peer
            r = await api.get(f"/v1/jobs/{seeded.job}/checkpoints/{seeded.step}")
            assert r.status_code == 200, r.text
            for shard in r.json()["shards"]:
                (rep,) = [x for x in shard["replicas"] if x["tier"] == "peer"]
                node = next(sh.node for sh in seeded.shards if sh.path == shard["path"])
                assert (rep["node"], rep["state"]) == (RING[node], "verified"), rep
                # Read back by the scrub on its holder, except the one it found bad.
                assert (rep["scrubbed_at"] is None) == (shard["path"] == rotten.path), rep

            # An operator's read-back of the whole peer copy reads each replica on its holder.
            _flip(_peer_copy(cfg, seeded, seeded.shards[1]))
            async with running_workers(cfg, client):
                outcome = await _verify(api, seeded, "peer")
                assert (outcome["read"], outcome["good"], outcome["corrupt"]) == (4, 3, 1), outcome
                await repair_result(client, seeded)
            _healed(cfg, engine, seeded)
    finally:
        engine.dispose()


async def test_reconcile_finds_a_deleted_peer_copy_on_its_holder_and_repair_restores_it(
    cfg: Settings, services: Services, client: Client
) -> None:
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        async with running_workers(cfg, client):
            seeded = await promoted(cfg, client, engine, workers=False)
            gone = seeded.shards[-1]
            _peer_copy(cfg, seeded, gone).unlink()

            report = await run_reconcile(
                client,
                f"reconcile-test/{seeded.job}",
                ReconcileInput(tier="peer", job=seeded.job, repair=True),
            )
            by_node = {r.node: r for r in report.tiers}
            assert set(by_node) == set(NODES), report
            holder = by_node[RING[gone.node]]
            assert holder.error is None and holder.counts == {"missing": 1}, holder
            assert holder.examples["missing"] == [f"{seeded.job}/{seeded.step}/{gone.path}"]
            assert holder.marked == 1 and holder.checked == 2, holder
            other = by_node[gone.node]
            assert other.counts == {} and other.checked == 2 and other.scanned == 2, other
            assert report.repairs_requested == 1
            repaired = await repair_result(client, seeded)
        assert {t.tier: t.state for t in repaired.tiers} == {"peer": "restorable"}, repaired
        assert replica_states(engine, seeded.checkpoint_id)[("peer", gone.path)] == "verified"
        _healed(cfg, engine, seeded)
        lost = [d for k, t, d in events(engine, seeded.checkpoint_id, "lost") if t == "peer"]
        assert lost, "reconcile recorded no lost peer copy"
    finally:
        engine.dispose()
