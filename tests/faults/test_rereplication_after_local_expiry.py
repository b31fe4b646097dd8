"""A holder lost after the writers' local copies of an older step expired: the peer copies it held
are made again from the fastest copy still verified on any tier (another peer copy on a live
node, else the shared tier, else S3), not only from the writer's local copy, which retention let
go (before, "no verified source replica on ssd (expired)" left the peer tier failed for good,
with lustre and S3 holding the file).

As the attacker met it: the local tier keeps 1 step and the peer tiers 3; steps 1 and 2 written
through the API on nodes a and b; a node that wrote nothing, but held copies of both, declared
lost. 1 or 2 copies, 3 to 5 nodes, with and without racks, with and without tiers below. Real
services (Temporal dev server, Postgres, moto, the API in the test process), real files, real
workers and data endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

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
    record_history,
    recording_histories,
    running_workers,
    shard_file,
)
from tests.helpers.peer_faults import (
    checkpoint_id,
    copied_events,
    peer_copies,
    peer_settings,
    wait_for_endpoints,
    write_and_register,
)
from tests.helpers.retention import create_job, markers, settle
from tests.helpers.services import fresh_database
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Event
from tierpoint.config import Settings
from tierpoint.contract.integrity import RepairResult, repair_workflow_id
from tierpoint.contract.peer import rereplicate_id

POLICY = {"kinds": {"local": {"keep_last": 1}, "peer": {"keep_last": 3}}}


@pytest.fixture
def migrated_url(_template_url: str) -> str:
    """A catalog of each case's own: placement's ring is every node that reported in lately, and
    an earlier case's nodes, which no worker serves now, must not be in it."""
    return fresh_database(_template_url, template=True)


@pytest.mark.parametrize(
    ("copies", "count", "racks", "below", "lost", "sources"),
    [
        # Ring a -> b -> c: c holds b's copies; b's step 1 comes from lustre.
        pytest.param(1, 3, None, True, "c", {"peer": {"b": "lustre"}}, id="1-copy-3-nodes"),
        # a's copies on b, c; b's on c, d. c lost: a's second copy from its first (on b), b's
        # first from its second (on d), over the holders' endpoints, before lustre and S3.
        pytest.param(
            2,
            4,
            None,
            True,
            "c",
            {"peer.2": {"a": "peer"}, "peer": {"b": "peer.2"}},
            id="2-copies-4-nodes",
        ),
        pytest.param(
            2,
            4,
            None,
            False,
            "c",
            {"peer.2": {"a": "peer"}, "peer": {"b": "peer.2"}},
            id="2-copies-4-nodes-nothing-below",
        ),
        # Racks 1 2 3 1 2: a's copies on b, c; b's on c, d. c lost: the same sources.
        pytest.param(
            2,
            5,
            "12312",
            True,
            "c",
            {"peer.2": {"a": "peer"}, "peer": {"b": "peer.2"}},
            id="2-copies-5-nodes-racks",
        ),
    ],
)
async def test_a_peer_copy_is_made_again_after_the_local_copy_expired(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
    copies: int,
    count: int,
    racks: str | None,
    below: bool,
    lost: str,
    sources: dict[str, dict[str, str]],
) -> None:
    tag = uuid.uuid4().hex[:8]
    nodes = [f"{tag}-{x}" for x in "abcde"[:count]]
    writers = nodes[:2]
    gone = f"{tag}-{lost}"
    domains = {n: f"rack-{r}" for n, r in zip(nodes, racks, strict=True)} if racks else None
    cfg = peer_settings(
        settings, tmp_path, nodes, later=below, copies=copies, failure_domain=domains
    )
    peers = [t.name for t in cfg.peer_tiers()]
    job = f"expired-{tag}"
    create_job(sessions, job, POLICY)
    admin = create_token(cfg.database_url, scopes=["admin"])
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with (
        running_workers(cfg, client, nodes=nodes),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, nodes, 60)
        trainer = TierpointClient(api, token=trainer_token)
        for step in (1, 2):
            result = await write_and_register(trainer, client, cfg, job, step, writers)
            assert all(t.state == "restorable" for t in result.tiers), result
        await settle(client, job)
        state = markers(sessions, job)
        assert state[(1, "ssd")] == "expired" and state[(2, "ssd")] == "restorable", state
        assert all(state[(s, t)] == "restorable" for s in (1, 2) for t in peers), state
        one = checkpoint_id(sessions, job, 1)
        held = {t: {c.node for c in peer_copies(sessions, one, t).values()} for t in peers}
        assert gone not in writers and any(gone in h for h in held.values()), held

        r = await http.post(f"/v1/nodes/{gone}/lost")
        assert r.status_code == 200 and r.json()["peer_rereplications"] == 2, r.text
        for step in (1, 2):
            await asyncio.wait_for(
                client.get_workflow_handle(rereplicate_id(job, step)).result(), RESULT_TIMEOUT
            )
        if recording_histories() and copies == 2 and below and racks is None:
            # Batches read from another peer tier's holder, over its endpoint.
            await record_history(client, rereplicate_id(job, 1), "peer_rereplicate_from_peer")

    state = markers(sessions, job)
    assert all(state[(s, t)] == "restorable" for s in (1, 2) for t in peers), state
    # Step 1's copies were read from the fastest copy left on another tier.
    for tier, by_writer in sources.items():
        last = {}
        for e in copied_events(sessions, one, tier):
            last[e["node"]] = e["source"]
        want = {f"{tag}-{w}": src for w, src in by_writer.items()}
        assert {n: last[n] for n in want} == want, copied_events(sessions, one, tier)
    # Every shard's copies verified on distinct live nodes, none on its own.
    for cid in (one, checkpoint_id(sessions, job, 2)):
        per_shard: dict[str, list[str | None]] = {}
        for t in peers:
            for path, c in peer_copies(sessions, cid, t).items():
                assert c.state == "verified" and c.node != gone, (t, path, c)
                per_shard.setdefault(path, []).append(c.node)
        for path, holders in per_shard.items():
            writer = path.split("/")[0].removeprefix("rank-")
            assert len(set(holders)) == copies and writer not in holders, (path, holders)
    assert_catalog_matches_tiers(cfg, engine, [one])


@pytest.mark.parametrize("below", [True, False], ids=["with-tiers-below", "nothing-below"])
async def test_a_rotten_peer_copy_is_repaired_from_the_other_peer_copy(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
    below: bool,
) -> None:
    """Repair reads the fastest copy left too: a bit flipped in step 1's first peer copy, after
    its local copy expired, is mended from the second peer copy on its holder (not from S3, and
    not left damaged for want of a tier below)."""
    tag = uuid.uuid4().hex[:8]
    a, b, c = nodes = [f"{tag}-{x}" for x in "abc"]
    cfg = peer_settings(settings, tmp_path, nodes, later=below, copies=2)
    job = f"mend-{tag}"
    create_job(sessions, job, POLICY)
    admin = create_token(cfg.database_url, scopes=["admin"])
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with (
        running_workers(cfg, client, nodes=nodes),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, nodes, 60)
        trainer = TierpointClient(api, token=trainer_token)
        for step in (1, 2):
            await write_and_register(trainer, client, cfg, job, step, [a])
        await settle(client, job)
        assert markers(sessions, job)[(1, "ssd")] == "expired"
        one = checkpoint_id(sessions, job, 1)
        copies = peer_copies(sessions, one)
        path = sorted(copies)[0]
        assert {x.node for x in copies.values()} == {b}, copies
        rotten = shard_file(cfg, "peer", b, job, 1, path)
        good = rotten.read_bytes()
        rotten.write_bytes(good[:100] + bytes([good[100] ^ 0x01]) + good[101:])

        body = await _verified(http, f"/v1/jobs/{job}/checkpoints/1/verify", "peer")
        assert body["outcome"]["corrupt"] == 1, body
        repaired = await asyncio.wait_for(
            client.get_workflow_handle(
                repair_workflow_id(job, 1), result_type=RepairResult
            ).result(),
            RESULT_TIMEOUT,
        )

    assert {t.tier: t.state for t in repaired.tiers} == {"peer": "restorable"}, repaired
    assert markers(sessions, job)[(1, "peer")] == "restorable"
    assert rotten.read_bytes() == good
    (event,) = repair_events(sessions, one)
    assert event["sources"] == {"peer.2": 1} and event["node"] == a, event
    assert shard_file(cfg, "peer.2", c, job, 1, path).read_bytes() == good
    assert_catalog_matches_tiers(cfg, engine, [one])


async def _verified(http: httpx.AsyncClient, url: str, tier: str) -> dict[str, Any]:
    """An operator's read-back of one tier's copy, once its run completed (asking again joins
    the run)."""
    async with asyncio.timeout(RESULT_TIMEOUT):
        while True:
            r = await http.post(url, json={"tier": tier})
            assert r.status_code == 202, r.text
            body: dict[str, Any] = r.json()
            if body["status"] != "running":
                assert body["status"] == "completed", body
                return body
            await asyncio.sleep(0.2)


def repair_events(sessions: sessionmaker[Session], cid: int) -> list[dict[str, object]]:
    with sessions() as s:
        rows = s.scalars(
            select(Event.detail).where(
                Event.checkpoint_id == cid, Event.kind == "repaired", Event.tier == "peer"
            )
        )
        return [dict(d or {}) for d in rows]
