"""A coded peer tier (rs(2,1)) through the real lifecycle on real services: four node workers
with their data endpoints, a real Temporal server, the catalog with its migrations. Each node's
sealed files are cut into stripes on the node, every holder pulls its stripe over the data
endpoint and reads it back, the coded copy is promoted through its stripes, and the staging
areas are emptied; any k held stripes give each file back, byte for byte, and a stripe with a
flipped byte is read around; a declared-lost holder leaves the copy restorable while every set
keeps k stripes, and a second one that takes a set below k fails it.

The shared worker is built here from the project's own activity objects and workflows: the
project's shared worker still refuses a coded tier at start (the restore does not read stripes
yet), and that refusal is what keeps a deployment from relying on this copy path."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from temporalio.worker import Worker
from tierpoint_client.erasure import Code
from tierpoint_client.erasure.files import StripeFile, decode_path

from activities.registration import activities_of
from activities.stores import Stores
from apps.worker import activity_objects
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import (
    crc_hex,
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.services import node_lost
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.tier_config import TierConfig, TierKind
from workflows.registry import WORKFLOWS

CODE = Code(2, 1)
SOURCES = ("node-a", "node-b")
NODES = (*SOURCES, "node-c", "node-d")
WORKER_SECRET = "tp_worker-credential-of-this-test"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    ssd, *_ = settings.tiers
    coded = TierConfig(
        name="coded", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/coded"), code=str(CODE)
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, coded], "data_token": WORKER_SECRET}
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
    executor = ThreadPoolExecutor(max_workers=8)
    shared = Worker(
        client,
        task_queue=SHARED_TASK_QUEUE,
        workflows=list(WORKFLOWS),
        activities=activities_of(
            *activity_objects(sessions, settings, Stores(settings), client=client)
        ),
        activity_executor=executor,
    )
    try:
        since = db_now(engine)
        async with running_workers(settings, client, nodes=NODES, shared=False):
            # The plan places stripes on the nodes serving when it runs: all four, reported in.
            await workers_reported_in(engine, NODES, since)
            async with shared:
                result, _ = await run_lifecycle(client, seeded)
    finally:
        executor.shutdown(wait=False)
    outcome = {t.tier: t.state.value for t in result.tiers}
    assert outcome == {"ssd": "restorable", "coded": "restorable"}, markers(
        sessions, seeded.checkpoint_id
    )

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

    # A flipped byte in one held stripe at rest: caught by its crc32c, read around.
    sh = shards[0]
    held = {r.stripe_index: r for r in rows if r.path == sh.path}
    every = [
        StripeFile(i, coded.root_for(r.node_id) / job / "1" / sh.path, r.crc32c)
        for i, r in held.items()
    ]
    rotten = every[0].path.read_bytes()
    every[0].path.write_bytes(bytes([rotten[0] ^ 0x01]) + rotten[1:])
    out = tmp_path / "read-around"
    used = decode_path(CODE, len(sh.data), crc_hex(sh.data), every, out)
    assert out.read_bytes() == sh.data and 0 in used.rejected

    # Holders declared lost, as an operator does: through m of a set's holders the coded copy
    # stays restorable; one more and it is not, and says which node took it below k.
    async def declare(node: str) -> None:
        engine_async = make_async_engine(settings.database_url, pool_size=1)
        try:
            async with async_sessions(engine_async).begin() as s:
                await node_lost.declare(s, settings, node, "test")
        finally:
            await engine_async.dispose()

    # node-c holds a stripe of both sets (the third node of both rings): each keeps k.
    assert {by_shard[r.path].node for r in rows if r.node_id == "node-c"} == set(SOURCES)
    await declare("node-c")
    assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"
    await declare("node-d")
    state, reason = markers(sessions, seeded.checkpoint_id)["coded"]
    assert state == "failed" and "node-d" in (reason or ""), (state, reason)
