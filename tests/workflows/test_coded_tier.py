"""A coded peer tier (rs(2,1)) through the real lifecycle and the client's restore on real
services: four node workers with their data endpoints and the project's own shared worker (which
starts with a code the cluster can place), a real Temporal server, the catalog with its
migrations. Each node's sealed files are cut into stripes on the node, every holder pulls its
stripe over the data endpoint and reads it back, the coded copy is promoted through its stripes,
and the staging areas are emptied. A shard's node declared lost: the restore plan offers the
coded copy, and the client's restore reads its files from k holders' data endpoints, a held
stripe with a flipped byte read around, byte for byte. A second lost holder takes a set below
k: the coded copy fails, the plan names the shared tier, and the restore reads it from there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure import Code
from tierpoint_client.erasure.files import StripeFile, decode_path
from tierpoint_client.models import PlanEntry
from tierpoint_client.restore import restore_plan

from api.schemas.checkpoints import RestorePlanEntryOut
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import (
    crc_hex,
    markers,
    new_job,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.config import Settings
from tierpoint.services import node_lost
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
SOURCES = ("node-a", "node-b")
NODES = (*SOURCES, "node-c", "node-d")
WORKER_SECRET = "tp_worker-credential-of-this-test"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    ssd, lustre, _ = settings.tiers
    coded = TierConfig(
        name="coded", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/coded"), code=str(CODE)
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, coded, lustre], "data_token": WORKER_SECRET}
    )


async def test_the_lifecycle_cuts_pulls_verifies_and_promotes_a_coded_copy(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    job = new_job()
    # Two segments and a bit: stripes span a segment boundary.
    shards = random_shards(SOURCES, 2, 2 * 4 * 1024 * 1024 + 4099)
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    since = db_now(engine)
    # The restores below read the holders' data endpoints: the workers serve until the end.
    async with running_workers(settings, client, nodes=NODES):
        # The plan places stripes on the nodes serving when it runs: all four, reported in.
        await workers_reported_in(engine, NODES, since)
        result, handle = await run_lifecycle(client, seeded)
        outcome = {t.tier: t.state.value for t in result.tiers}
        assert outcome == {"ssd": "restorable", "coded": "restorable", "lustre": "restorable"}, (
            markers(sessions, seeded.checkpoint_id)
        )
        if recording_histories():
            await record_history(client, handle.id, "lifecycle_with_coded_tier")

        with sessions() as s:
            rows = s.execute(
                select(Shard.path, Stripe.stripe_index, Stripe.node_id, Stripe.crc32c, Stripe.state)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == seeded.checkpoint_id)
            ).all()
        assert len(rows) == len(shards) * CODE.width
        assert {r.state for r in rows} == {"verified"}
        by_shard = {sh.path: sh for sh in shards}
        coded = settings.tier("coded")
        for sh in shards:
            held = {r.stripe_index: r for r in rows if r.path == sh.path}
            assert sh.node not in {r.node_id for r in held.values()}
            # Any k: here the parity stripe and the last data stripe, each from its holder's root.
            files = [
                StripeFile(i, coded.root_for(held[i].node_id) / job / "1" / sh.path, held[i].crc32c)
                for i in (CODE.k + CODE.m - 1, CODE.k - 1)
            ]
            out = tmp_path / f"decoded-{sh.node}-{sh.path.rsplit('/', 1)[-1]}"
            decode_path(CODE, len(sh.data), crc_hex(sh.data), files, out)
            assert out.read_bytes() == by_shard[sh.path].data
        # Every set verified whole: the shards' nodes kept no stripe in their staging areas.
        for node in SOURCES:
            staging = coded.root_for(node) / STAGING_DIR
            assert [p for p in staging.rglob("*") if p.is_file()] == []

        async def declare(node: str) -> None:
            engine_async = make_async_engine(settings.database_url, pool_size=1)
            try:
                async with async_sessions(engine_async).begin() as s:
                    await node_lost.declare(s, settings, node, "test")
            finally:
                await engine_async.dispose()

        # node-a, a shard's node, is lost as an operator declares it: its own files and its
        # stripe of node-b's set with it. Every set keeps k, so the coded copy stays restorable.
        assert {by_shard[r.path].node for r in rows if r.node_id == "node-a"} == {"node-b"}
        await declare("node-a")
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"
        # A byte flipped at rest in one held stripe of node-a's first file.
        sh = shards[0]
        assert sh.node == "node-a"
        rotten = next(r for r in rows if r.path == sh.path and r.stripe_index == 0)
        held_file = coded.root_for(rotten.node_id) / job / "1" / sh.path
        was = held_file.read_bytes()
        held_file.write_bytes(bytes([was[0] ^ 0x01]) + was[1:])

        plan = _plan(settings, sessions, job)
        assert {e.tier for e in plan} == {"coded"}
        for e in plan:
            assert e.code == str(CODE) and len(e.stripes) >= CODE.k
            assert "node-a" not in {st.node for st in e.stripes}
        restored = await asyncio.to_thread(_restore, plan, tmp_path / "spare-1")
        assert restored == {sh.path: sh.data for sh in shards}

        # node-c holds a stripe of node-b's set too: with node-a's gone that set keeps one, below k.
        await declare("node-c")
        state, reason = markers(sessions, seeded.checkpoint_id)["coded"]
        assert state == "failed" and "node-c" in (reason or ""), (state, reason)
        plan = _plan(settings, sessions, job)
        assert {e.tier for e in plan} == {"lustre"}
        assert await asyncio.to_thread(_restore, plan, tmp_path / "spare-2") == {
            sh.path: sh.data for sh in shards
        }


def _plan(settings: Settings, sessions: sessionmaker[Session], job: str) -> list[PlanEntry]:
    """The restore plan of the job's latest checkpoint for a reader on no node of the job (a
    spare), as the API sends it and the client reads it."""
    with sessions() as s:
        latest = latest_restorable(s, job, settings.tiers)
    return [
        PlanEntry.from_json(RestorePlanEntryOut.model_validate(e).model_dump(mode="json"))
        for e in latest.plan
    ]


def _restore(plan: list[PlanEntry], dest: Path) -> dict[str, bytes]:
    """The client's restore of `plan` into `dest`: the files it put there, by path."""
    restore_plan(plan, dest, {}, token=WORKER_SECRET)
    return {e.path: (dest / e.path).read_bytes() for e in plan}
