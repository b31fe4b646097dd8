"""The peer tier end to end on real services: each node's local copies pulled by the next live
node over its data endpoint, verified and promoted; a node declared lost; its shards restored by
the client on another node from the peer copies, through the endpoint, verified; a holder
declared lost, and its copies made again on the next live node. The endpoint's
refusals (no, wrong or too narrow a credential; paths it does not serve) and its ranges."""

from __future__ import annotations

import asyncio
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
    RESULT_TIMEOUT,
    ShardSpec,
    crc_hex,
    markers,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.retention import create_job, settle
from tests.helpers.retention import markers as job_markers
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Node, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import workflow_id
from tierpoint.contract.peer import rereplicate_id
from tierpoint.tier_config import TierConfig, TierKind

SOURCES = ("node-a", "node-b")
# node-c and node-d write nothing: the ring is a -> b -> c -> d -> a.
LIVE = (*SOURCES, "node-c", "node-d")
# The endpoint's test runs its own nodes: the module's catalog keeps node-a lost.
SERVING = ("node-p", "node-q")
WORKER_SECRET = "tp_worker-credential-of-this-test"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    ssd, *rest = settings.tiers
    peer = TierConfig(name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"))
    for node in (*LIVE, *SERVING):
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nodes" / node / "peer").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {
            **settings.model_dump(),
            "tiers": [ssd, peer, *rest],
            "data_token": WORKER_SECRET,
        }
    )


def holders(
    sessions: sessionmaker[Session], checkpoint_id: int
) -> dict[str, tuple[str | None, str]]:
    """path -> (holding node, state) of each shard's peer copy."""
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Replica.node_id, Replica.state)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id, Replica.tier == "peer")
        )
        return {p: (n, st) for p, n, st in rows}


def data_url(sessions: sessionmaker[Session], node: str) -> str:
    with sessions() as s:
        url = s.scalar(select(Node.data_url).where(Node.id == node))
    assert url is not None, f"{node} reported no data endpoint"
    return url


async def test_peer_copies_restore_a_lost_nodes_shards(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    job = f"peer-{uuid.uuid4().hex[:10]}"
    shards = random_shards(SOURCES, 2, 96 * 1024 + 7)
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    async with running_workers(settings, client, nodes=LIVE):
        result, _ = await run_lifecycle(client, seeded)
        state = markers(sessions, seeded.checkpoint_id)
        assert {t.tier: t.state.value for t in result.tiers} == {
            "ssd": "restorable",
            "peer": "restorable",
            "lustre": "restorable",
            "s3": "restorable",
        }, state
        ring = {"node-a": "node-b", "node-b": "node-c"}
        held = holders(sessions, seeded.checkpoint_id)
        for sh in shards:
            assert held[sh.path] == (ring[sh.node], "verified")
            # On the holder's own storage, byte for byte; never on the shard's own node.
            copy = shard_file(settings, "peer", ring[sh.node], job, 1, sh.path)
            assert copy.read_bytes() == sh.data
            assert not shard_file(settings, "peer", sh.node, job, 1, sh.path).exists()

        admin = create_token(settings.database_url, scopes=["admin"])
        trainer = create_token(settings.database_url, scopes=[f"train:{job}"])
        async with serving(create_app(settings)) as api:
            async with httpx.AsyncClient(base_url=api) as http:
                r = await http.post("/v1/nodes/node-a/lost", headers=bearer(admin))
                assert r.status_code == 200, r.text
            # node-a's ranks restart on node-c: its files come from node-b's peer copies, the
            # rest from node-c's own peer copies, all through the data endpoints.
            restored = TierpointClient(api, token=trainer).restore(
                job, tmp_path / "restore", node="node-c"
            )
            # node-c, which held node-b's copies, is lost too: they are copied again to the node
            # after node-b among the live ones, node-d, and the tier is restorable again.
            async with httpx.AsyncClient(base_url=api) as http:
                r = await http.post("/v1/nodes/node-c/lost", headers=bearer(admin))
                assert r.status_code == 200 and r.json()["peer_rereplications"] == 1, r.text
            again = client.get_workflow_handle(rereplicate_id(job, 1))
            await asyncio.wait_for(again.result(), RESULT_TIMEOUT)
            if recording_histories():
                await record_history(client, workflow_id(job, 1), "lifecycle_with_peer_tier")
                await record_history(client, again.id, "peer_rereplicate")
    assert restored.step == 1
    assert {f.path: f.tier for f in restored.files} == {sh.path: "peer" for sh in shards}
    for sh in shards:
        assert (tmp_path / "restore" / sh.path).read_bytes() == sh.data
    assert markers(sessions, seeded.checkpoint_id)["peer"][0] == "restorable"
    assert markers(sessions, seeded.checkpoint_id)["ssd"][0] == "failed"
    ring = {"node-a": "node-b", "node-b": "node-d"}
    held = holders(sessions, seeded.checkpoint_id)
    for sh in shards:
        assert held[sh.path] == (ring[sh.node], "verified")
        assert shard_file(settings, "peer", ring[sh.node], job, 1, sh.path).read_bytes() == sh.data
    checked = assert_catalog_matches_tiers(settings, engine, [seeded.checkpoint_id])
    assert checked.verified["peer"] == len(shards) and checked.restorable["peer"] == 1, checked


async def test_the_data_endpoint_serves_only_registered_verified_files_to_credentials_and_expires(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
) -> None:
    job = f"served-{uuid.uuid4().hex[:10]}"
    # Retention keeps one peer copy: the next step's expires this one's on its holder.
    create_job(sessions, job, {"tiers": {"peer": {"keep_last": 1}}})
    data = bytes(range(256)) * 1000
    # A name a URL would cut or decode: the endpoint serves it as the POSIX name it is.
    odd = ShardSpec("node-p", "dir/a?b#c%20.bin", data, crc_hex(data))
    seeded = seed_checkpoint(settings, sessions, job, 3, [odd])
    # Registered before the workers start: seeding reports the node in without an endpoint.
    later = seed_checkpoint(settings, sessions, job, 4, [odd])
    # On the disk, registered, but sealed corrupt (its bytes are not the registered ones).
    bad = seed_checkpoint(
        settings, sessions, job, 5, [ShardSpec("node-p", "bad.bin", data, crc_hex(b"other"))]
    )
    # Not registered, beside a registered one: never served.
    stray = shard_file(settings, "ssd", "node-p", job, 3, "dir/stray.bin")
    stray.write_bytes(b"not registered")
    trainer = create_token(settings.database_url, scopes=[f"train:{job}"])
    other = create_token(settings.database_url, scopes=["train:someone-else"])
    async with running_workers(settings, client, nodes=SERVING):
        await run_lifecycle(client, seeded)
        await run_lifecycle(client, bad)
        base = data_url(sessions, "node-p")
        url = f"{base}/v1/data/ssd/{job}/3/dir/a%3Fb%23c%2520.bin"
        async with httpx.AsyncClient() as http:
            for headers, status in (
                ({}, 401),
                (bearer("tp_wrong"), 401),
                (bearer(other), 403),
                (bearer(WORKER_SECRET), 200),
                (bearer(trainer), 200),
            ):
                r = await http.get(url, headers=headers)
                assert r.status_code == status, (headers, r.text)
                if status == 200:
                    assert r.content == data
                else:
                    assert data[:64] not in r.content
            ranged = await http.get(url, headers={**bearer(trainer), "Range": "bytes=1000-1999"})
            assert ranged.status_code == 206
            assert ranged.content == data[1000:2000]
            assert ranged.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
            for path in (
                f"/v1/data/ssd/{job}/3/dir/stray.bin",  # on the disk, not registered
                f"/v1/data/ssd/{job}/5/bad.bin",  # registered, not verified
                f"/v1/data/peer/{job}/3/dir/a%3Fb%23c%2520.bin",  # node-p holds no peer copy
                f"/v1/data/lustre/{job}/3/dir/a%3Fb%23c%2520.bin",  # not a node's tier
            ):
                r = await http.get(base + path, headers=bearer(trainer))
                assert r.status_code == 404, (path, r.text)
            for path in (
                f"/v1/data/ssd/{job}/3/dir/%2E%2E/%2E%2E/x",
                f"/v1/data/ssd/{job}/3//etc/passwd",
            ):
                r = await http.get(base + path, headers=bearer(trainer))
                assert r.status_code == 400, (path, r.text)

        held = shard_file(settings, "peer", "node-q", job, 3, odd.path)
        assert held.read_bytes() == data
        await run_lifecycle(client, later)
        await settle(client, job)
        state = job_markers(sessions, job)
        assert state[(3, "peer")] == "expired" and state[(4, "peer")] == "restorable", state
        # Deleted on the holder that kept it, by that node's worker; the other tiers keep step 3.
        assert not held.exists()
        assert shard_file(settings, "peer", "node-q", job, 4, odd.path).read_bytes() == data
        assert state[(3, "ssd")] == "restorable" and state[(3, "lustre")] == "restorable"
