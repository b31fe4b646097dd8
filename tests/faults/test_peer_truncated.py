"""A peer copy truncated on its holder, behind tierpoint's back: at rest, and while the holder's
data endpoint is sending it.

Before, the endpoint promised the registered Content-Length, ran short and closed: a reader saw a
read error, not a mismatch, reported nothing, and `latest?tier=peer` kept offering the copy until
a scrub reached it (a week by default). Now the endpoint finds it short (by fstat before it
answers, or by a short read while it sends), marks the replica `corrupt` and demotes the peer
tier in one transaction before the reader gets its error, and asks for the checkpoint's repair.
So one read later the catalog no longer calls the copy verified, latest stops offering the peer
tier, the read that met it still gets the file from another copy, and repair makes the copy
again.

Real services: Postgres, the Temporal dev server with real workers for three nodes (each serving
its data endpoint) and the shared worker, the API under uvicorn, the training client's restore;
the truncation is a real `truncate` of the holder's file. Placed by construction: the read runs
while only the nodes' workers do (the repair it asks for waits for the shared worker, started
afterwards), and the in-flight truncation happens after the reader has taken the first MiB of the
body and before it reads on, the file being larger than the loopback's socket buffers hold."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import (
    ShardSpec,
    crc_hex,
    markers,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import (
    POLL,
    WORKER_SECRET,
    data_url,
    peer_copies,
    peer_settings,
    wait_for_endpoints,
)
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

GUARD = 180.0  # a hang guard for the repair, not a timing
BIG = 64 * 1024 * 1024


# Sorted ids form the ring: a's copies are held by b, b's by c, c's by a. One set for the module:
# placement counts every node that reported in lately, so another test's nodes would join it.
_TAG = uuid.uuid4().hex[:8]
NODES = [f"a-{_TAG}", f"b-{_TAG}", f"c-{_TAG}"]


async def repaired(sessions: sessionmaker[Session], checkpoint_id: int, path: str) -> None:
    """Wait until repair has made the peer copy again and promoted the peer tier."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD
    while True:
        copy = peer_copies(sessions, checkpoint_id)[path]
        if copy.state == "verified" and markers(sessions, checkpoint_id)["peer"][0] == "restorable":
            return
        assert loop.time() < deadline, f"never repaired: {copy}, {markers(sessions, checkpoint_id)}"
        await asyncio.sleep(POLL)


async def test_a_peer_copy_truncated_at_rest_is_marked_at_its_first_read_and_made_again(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    a, b, c = NODES
    cfg = peer_settings(settings, tmp_path, [a, b, c], later=True)
    # ssd -> peer -> lustre: the restore finds the file on lustre once the peer copy fails.
    cfg = cfg.model_copy(update={"tiers": [t for t in cfg.tiers if t.name != "s3"]})
    job = f"truncated-{uuid.uuid4().hex[:8]}"
    shards = []
    for name in ("model.bin", "optim.bin"):
        data = os.urandom(256 * 1024 + 3)
        shards.append(ShardSpec(a, name, data, crc_hex(data)))
    seeded = seed_checkpoint(cfg, sessions, job, 1, shards)
    model = shards[0]
    trainer = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with running_workers(cfg, client, nodes=[a, b, c]):
        result, _ = await run_lifecycle(client, seeded)
    assert {t.tier: t.state.value for t in result.tiers} == {
        "ssd": "restorable",
        "peer": "restorable",
        "lustre": "restorable",
    }
    copy = peer_copies(sessions, seeded.checkpoint_id)[model.path]
    assert (copy.node, copy.state) == (b, "verified")
    held = cfg.tier("peer").root_for(b) / job / "1" / model.path
    os.truncate(held, len(model.data) // 2)  # behind tierpoint's back
    before = {b: data_url(sessions, b)}

    latest = f"/v1/jobs/{job}/checkpoints/latest"
    # The nodes' workers alone, serving their endpoints: a repair asked for waits for the shared
    # worker, so what one read changed can be seen before repair changes it again.
    async with (
        running_workers(cfg, client, nodes=[a, b, c], shared=False),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api) as http,
    ):
        r = await http.get(latest, params={"tier": "peer"}, headers=bearer(trainer))
        assert r.status_code == 200 and r.json()["step"] == 1, r.text
        # One plain GET of the copy, as a restore on another node makes it.
        served = await wait_for_endpoints(sessions, [b], GUARD, not_=before[b])
        url = f"{served[b]}/v1/data/peer/{job}/1/{model.path}"
        r = await http.get(url, headers=bearer(trainer))
        assert r.status_code == 404 and r.json()["code"] == "copy_damaged", r.text
        assert model.data[:64] not in r.content

        # That one read was enough: the copy is no longer called verified, the peer tier no
        # longer offered.
        copy = peer_copies(sessions, seeded.checkpoint_id)[model.path]
        assert copy.state == "corrupt" and "holds" in (copy.error or ""), copy
        state, reason = markers(sessions, seeded.checkpoint_id)["peer"]
        assert state == "failed" and model.path in (reason or ""), reason
        r = await http.get(latest, params={"tier": "peer"}, headers=bearer(trainer))
        assert r.status_code == 404, r.text
        assert r.json()["code"] == "no_restorable_checkpoint"

        # A restore on node c, which holds none of a's files, is sent to another copy.
        restored = await asyncio.to_thread(
            TierpointClient(api, token=trainer).restore, job, tmp_path / "restore", node=c
        )
        assert {f.path: f.tier for f in restored.files} == {sh.path: "lustre" for sh in shards}
        for sh in shards:
            assert (tmp_path / "restore" / sh.path).read_bytes() == sh.data

    # The shared worker runs the repair that was asked for: the copy is made again.
    async with (
        running_workers(cfg, client, nodes=[a, b, c]),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api) as http,
    ):
        await repaired(sessions, seeded.checkpoint_id, model.path)
        assert held.read_bytes() == model.data
        r = await http.get(latest, params={"tier": "peer"}, headers=bearer(trainer))
        assert r.status_code == 200 and r.json()["step"] == 1, r.text
    checked = assert_catalog_matches_tiers(cfg, engine, [seeded.checkpoint_id])
    assert checked.verified["peer"] == len(shards) and checked.restorable["peer"] == 1, checked


async def test_a_peer_copy_truncated_while_it_is_served_is_a_read_error_and_made_again(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
) -> None:
    a, b, c = NODES
    cfg = peer_settings(settings, tmp_path, [a, b, c])  # ssd -> peer
    job = f"truncated-live-{uuid.uuid4().hex[:8]}"
    data = os.urandom(BIG)
    shard = ShardSpec(a, "big.bin", data, crc_hex(data))
    seeded = seed_checkpoint(cfg, sessions, job, 1, [shard])
    async with running_workers(cfg, client, nodes=[a, b, c]):
        await run_lifecycle(client, seeded)
    copy = peer_copies(sessions, seeded.checkpoint_id)[shard.path]
    assert (copy.node, copy.state) == (b, "verified")
    held = cfg.tier("peer").root_for(b) / job / "1" / shard.path

    def read_while_truncated(url: str) -> tuple[int, bytes, Exception | None]:
        got = bytearray()
        with (
            httpx.Client(timeout=60) as http,
            http.stream("GET", url, headers=bearer(WORKER_SECRET)) as r,
        ):
            status = r.status_code
            chunks = r.iter_raw(64 * 1024)
            try:
                while len(got) < 1024 * 1024:
                    got += next(chunks)
                # The endpoint is mid-body: cut the file under it, then read on.
                os.truncate(held, 2 * 1024 * 1024)
                for chunk in chunks:
                    got += chunk
            except httpx.HTTPError as exc:
                return status, bytes(got), exc
        return status, bytes(got), None

    before = data_url(sessions, b)
    async with running_workers(cfg, client, nodes=[a, b, c], shared=False):
        served = await wait_for_endpoints(sessions, [b], GUARD, not_=before)
        url = f"{served[b]}/v1/data/peer/{job}/1/{shard.path}"
        status, got, error = await asyncio.to_thread(read_while_truncated, url)
        assert status == 200
        assert len(got) < BIG, "the whole body arrived before the truncation: make BIG larger"
        # A read error, never a short body taken for the file.
        assert isinstance(error, httpx.RemoteProtocolError), error
        assert got == data[: len(got)]
        # Recorded before the connection was cut.
        copy = peer_copies(sessions, seeded.checkpoint_id)[shard.path]
        assert copy.state == "corrupt" and "while served" in (copy.error or ""), copy
        assert markers(sessions, seeded.checkpoint_id)["peer"][0] == "failed"

    async with running_workers(cfg, client, nodes=[a, b, c]):
        await repaired(sessions, seeded.checkpoint_id, shard.path)
    assert held.read_bytes() == data
    checked = assert_catalog_matches_tiers(cfg, engine, [seeded.checkpoint_id])
    assert checked.verified == {"ssd": 1, "peer": 1}, checked
