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
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure.files import StripeFile, decode_path

from tests.helpers.coded_tier import (
    CODE,
    NODES,
    SECRET,
    coded_settings,
    coded_stack,
    declare_lost,
    restore_on_spare,
    spare_plan,
    stripe_rows,
)
from tests.helpers.lifecycle import (
    crc_hex,
    markers,
    new_job,
    random_shards,
    record_history,
    recording_histories,
    run_lifecycle,
    seed_checkpoint,
)
from tierpoint.config import Settings
from tierpoint.storage.posix.staging import STAGING_DIR

SOURCES = ("node-a", "node-b")


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(settings, tmp_path, below=("lustre",), data_token=SECRET)


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
    # The restores below read the holders' data endpoints: the workers serve until the end. The
    # plan places stripes on the nodes serving when it runs: all four, reported in.
    async with coded_stack(settings, client, engine, NODES):
        result, handle = await run_lifecycle(client, seeded)
        outcome = {t.tier: t.state.value for t in result.tiers}
        assert outcome == {"ssd": "restorable", "coded": "restorable", "lustre": "restorable"}, (
            markers(sessions, seeded.checkpoint_id)
        )
        if recording_histories():
            await record_history(client, handle.id, "lifecycle_with_coded_tier")

        rows = stripe_rows(sessions, seeded.checkpoint_id)
        assert len(rows) == len(shards) * CODE.width
        assert {r.state for r in rows} == {"verified"}
        by_shard = {sh.path: sh for sh in shards}
        coded = settings.tier("coded")
        for sh in shards:
            held = {r.stripe_index: r for r in rows if r.path == sh.path}
            assert sh.node not in {r.holder for r in held.values()}
            # Any k: here the parity stripe and the last data stripe, each from its holder's root.
            files = [
                StripeFile(i, coded.root_for(held[i].holder) / job / "1" / sh.path, held[i].crc32c)
                for i in (CODE.k + CODE.m - 1, CODE.k - 1)
            ]
            out = tmp_path / f"decoded-{sh.node}-{sh.path.rsplit('/', 1)[-1]}"
            decode_path(CODE, len(sh.data), crc_hex(sh.data), files, out)
            assert out.read_bytes() == by_shard[sh.path].data
        # Every set verified whole: the shards' nodes kept no stripe in their staging areas.
        for node in SOURCES:
            staging = coded.root_for(node) / STAGING_DIR
            assert [p for p in staging.rglob("*") if p.is_file()] == []

        # node-a, a shard's node, is lost as an operator declares it: its own files and its
        # stripe of node-b's set with it. Every set keeps k, so the coded copy stays restorable.
        assert {by_shard[r.path].node for r in rows if r.holder == "node-a"} == {"node-b"}
        await declare_lost(settings, "node-a")
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"
        # A byte flipped at rest in one held stripe of node-a's first file.
        sh = shards[0]
        assert sh.node == "node-a"
        rotten = next(r for r in rows if r.path == sh.path and r.stripe_index == 0)
        held_file = coded.root_for(rotten.holder) / job / "1" / sh.path
        was = held_file.read_bytes()
        held_file.write_bytes(bytes([was[0] ^ 0x01]) + was[1:])

        plan = spare_plan(settings, sessions, job)
        assert {e.tier for e in plan} == {"coded"}
        for e in plan:
            assert e.code == str(CODE) and len(e.stripes) >= CODE.k
            assert "node-a" not in {st.node for st in e.stripes}
        restored = await asyncio.to_thread(restore_on_spare, plan, tmp_path / "spare-1")
        assert restored == {sh.path: sh.data for sh in shards}

        # node-c holds a stripe of node-b's set too: with node-a's gone that set keeps one, below k.
        await declare_lost(settings, "node-c")
        state, reason = markers(sessions, seeded.checkpoint_id)["coded"]
        assert state == "failed" and "node-c" in (reason or ""), (state, reason)
        plan = spare_plan(settings, sessions, job)
        assert {e.tier for e in plan} == {"lustre"}
        assert await asyncio.to_thread(restore_on_spare, plan, tmp_path / "spare-2") == {
            sh.path: sh.data for sh in shards
        }
