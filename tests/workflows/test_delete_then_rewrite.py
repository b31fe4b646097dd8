"""An admin deletes step S while the job writes step S again at the same paths and retries its
registration on 409 `checkpoint_being_deleted` until it answers 201 (docs/api.md): the new
checkpoint must become restorable everywhere, with the new bytes.

It did not: the old checkpoint's expiry deleted its local copy by path, which by then was the
job's new file; the retried registration answered 201 and the seal failed with "a.bin (missing)".
A delete now removes only the file the catalog verified at a path (its recorded identity): the
new file is kept, recorded in the step's history as `kept`, and sealed, copied and restored.

By construction, not timing: the node workers are stopped before the deletion, so the local
copies' deletes wait on the nodes' queues until the job has written the step again; the shared
worker deletes the shared and S3 copies meanwhile. Real API (uvicorn), real workers, Postgres,
Temporal and moto; the job is the training-side client.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client import ConflictError

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import crc_hex, running_workers, shard_file
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

STEP = 40
SIZE = 64 * 1024 + 5
WAIT = 300.0  # hang guard only


def write_step(settings: Settings, job: str, files: dict[tuple[str, str], bytes]) -> None:
    """What a training job does: each node writes its files to its local tier under a temp
    name and renames them into place (as the DCP writer does)."""
    for (node, path), data in files.items():
        final = shard_file(settings, "ssd", node, job, STEP, path)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, final)


def manifest(files: dict[tuple[str, str], bytes]) -> list[dict[str, object]]:
    return [
        {"path": path, "size": len(data), "crc32c": crc_hex(data), "node": node}
        for (node, path), data in files.items()
    ]


async def register_until_accepted(
    job_client: TierpointClient, job: str, body: list[dict[str, object]]
) -> int:
    """Register, retrying on 409 `checkpoint_being_deleted` as docs/api.md says; the number of
    refusals seen."""
    refused = 0
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await asyncio.to_thread(job_client.register_manifest, job, STEP, body)
                return refused
            except ConflictError as e:
                assert e.code == "checkpoint_being_deleted", e
                refused += 1
                await asyncio.sleep(0.2)


async def restorable_on(job_client: TierpointClient, job: str, tiers: Sequence[str]) -> None:
    for tier in tiers:
        await asyncio.to_thread(job_client.wait_restorable, job, STEP, tier, WAIT, 0.2)


async def history(api: str, admin: str, job: str) -> list[dict[str, object]]:
    async with httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http:
        r = await http.get(f"/v1/jobs/{job}/checkpoints/{STEP}/events", params={"limit": 1000})
    assert r.status_code == 200, r.text
    items: list[dict[str, object]] = r.json()["items"]
    return items


async def run_scenario(
    settings: Settings,
    client: Client,
    engine: Engine,
    tmp_path: Path,
    nodes: Sequence[str],
    shard_nodes: Sequence[str],
) -> None:
    tiers = settings.tier_names()
    job = f"rewrite-{uuid.uuid4().hex[:10]}"
    admin = create_token(settings.database_url, scopes=["admin"])
    train = create_token(settings.database_url, scopes=[f"train:{job}"])
    old = {(n, f"{n}/a.bin"): os.urandom(SIZE) for n in shard_nodes}
    # The same sizes, and on the first node the very same bytes (a deterministic run writing
    # the step again): only which file it is tells the new from the old.
    new = {key: data if key[0] == shard_nodes[0] else os.urandom(SIZE) for key, data in old.items()}

    async with (
        running_workers(settings, client, nodes=(), shared=True),
        serving(create_app(settings)) as api,
    ):
        job_client = TierpointClient(api, token=train)
        since = db_now(engine)
        async with running_workers(settings, client, nodes=nodes, shared=False):
            await workers_reported_in(engine, tuple(nodes), since)
            write_step(settings, job, old)
            await asyncio.to_thread(job_client.register_manifest, job, STEP, manifest(old))
            await restorable_on(job_client, job, tiers)
        # The node workers are gone: the local copies' deletes wait for them.
        async with httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http:
            r = await http.delete(f"/v1/jobs/{job}/checkpoints/{STEP}")
        assert r.status_code == 202, r.text
        write_step(settings, job, new)
        async with running_workers(settings, client, nodes=nodes, shared=False):
            refused = await register_until_accepted(job_client, job, manifest(new))
            assert refused >= 1  # the job did meet the deletion
            await restorable_on(job_client, job, tiers)
            # Every tier but the local one, whose copy is each node's own (checked below).
            restored = {
                tier: await asyncio.to_thread(
                    job_client.restore, job, tmp_path / "restore" / tier, tier=tier
                )
                for tier in tiers
                if tier != "ssd"
            }
            events = await history(api, admin, job)
        cp = await asyncio.to_thread(job_client.checkpoint, job, STEP)

    for tier, done in restored.items():
        assert done.step == STEP
        for (_, path), data in new.items():
            assert (tmp_path / "restore" / tier / path).read_bytes() == data, (tier, path)
    for (node, path), data in new.items():
        assert shard_file(settings, "ssd", node, job, STEP, path).read_bytes() == data
    # The old local copies' deletes found the new files and kept them, saying so.
    kept = [e for e in events if e["kind"] == "kept"]
    assert {(e["tier"], e["detail"]["node"]) for e in kept} == {  # type: ignore[index]
        ("ssd", n) for n in shard_nodes
    }, kept
    assert all(e["detail"]["reason"] == "replaced since verified" for e in kept)  # type: ignore[index]
    # Every other copy of the old checkpoint was deleted as verified: nothing else kept.
    checked = assert_catalog_matches_tiers(settings, engine, [cp_id(engine, job)])
    assert set(checked.restorable) == set(tiers), checked
    assert cp.shards is not None and {s.path for s in cp.shards} == {p for _, p in new}


def cp_id(engine: Engine, job: str) -> int:
    with engine.connect() as conn:
        found: int = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": STEP},
        ).scalar_one()
    return found


async def test_a_step_written_again_while_it_is_deleted_keeps_its_new_bytes(
    settings: Settings, client: Client, engine: Engine, tmp_path: Path
) -> None:
    """ssd -> lustre -> s3, a shard on each of two nodes."""
    nodes = ("node-a", "node-b")
    await run_scenario(settings, client, engine, tmp_path, nodes, nodes)


@pytest.fixture
def peer_settings(settings: Settings, tmp_path: Path) -> Settings:
    """ssd -> peer (copies = 2) -> lustre -> s3 on three nodes."""
    ssd, *rest = settings.tiers
    peer = TierConfig(
        name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"), copies=2
    )
    for node in ("node-a", "node-b", "node-c"):
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {
            **settings.model_dump(),
            "tiers": [ssd, peer, *rest],
            "data_token": "tp_worker-secret-of-rewrite",
        }
    )


async def test_with_two_peer_copies_on_three_nodes_the_new_bytes_are_kept_too(
    peer_settings: Settings, client: Client, engine: Engine, tmp_path: Path
) -> None:
    """The old checkpoint's two peer copies of each shard are deleted by their holders (they are
    the files the holders verified), its local copies are not (the job's new files are there),
    and the new checkpoint gets two peer copies of the new bytes."""
    assert peer_settings.tier_names() == ["ssd", "peer", "peer.2", "lustre", "s3"]
    nodes = ("node-a", "node-b", "node-c")
    await run_scenario(peer_settings, client, engine, tmp_path, nodes, ("node-a", "node-b"))


def identities(engine: Engine, job: str, tier: str) -> dict[str, str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.path, r.file_identity FROM replica r JOIN shard s ON s.id = r.shard_id "
                "JOIN checkpoint c ON c.id = r.checkpoint_id JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step AND r.tier = :tier"
            ),
            {"job": job, "step": STEP, "tier": tier},
        )
        return {path: identity for path, identity in rows}


async def test_a_replica_recorded_before_identities_gets_its_own_when_read_back(
    settings: Settings, client: Client, engine: Engine
) -> None:
    """Replicas recorded before the catalog kept identities have none: a delete then removes
    their file only if its bytes are the registered ones. The next read-back (the scrub, or an
    operator's verify as here) records the identity of the file it read, so that from then on a
    delete tells a file written again, even with the same bytes, from the one verified."""
    job = f"legacy-{uuid.uuid4().hex[:10]}"
    admin = create_token(settings.database_url, scopes=["admin"])
    files = {(n, f"{n}/a.bin"): os.urandom(SIZE) for n in ("node-a", "node-b")}
    since = db_now(engine)
    async with (
        running_workers(settings, client),
        serving(create_app(settings)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http,
    ):
        await workers_reported_in(engine, ("node-a", "node-b"), since)
        write_step(settings, job, files)
        job_client = TierpointClient(api, token=admin)
        await asyncio.to_thread(job_client.register_manifest, job, STEP, manifest(files))
        await restorable_on(job_client, job, settings.tier_names())
        sealed = identities(engine, job, "ssd")
        assert None not in sealed.values(), sealed
        with engine.begin() as conn:  # what migration 0013 leaves on rows recorded before it
            conn.execute(
                text("UPDATE replica SET file_identity = NULL WHERE checkpoint_id = :cid"),
                {"cid": cp_id(engine, job)},
            )
        async with asyncio.timeout(WAIT):
            while True:
                r = await http.post(
                    f"/v1/jobs/{job}/checkpoints/{STEP}/verify", json={"tier": "ssd"}
                )
                assert r.status_code == 202, r.text
                if r.json()["status"] == "completed":
                    break
                await asyncio.sleep(0.2)
        assert r.json()["outcome"]["good"] == len(files), r.json()
    assert identities(engine, job, "ssd") == sealed
    for (node, path), _ in files.items():
        st = shard_file(settings, "ssd", node, job, STEP, path).stat()
        assert sealed[path] == f"v1:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
