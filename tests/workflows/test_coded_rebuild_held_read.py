"""A coded peer tier's rebuild (rs(2,1), four files of one rank) whose holder is slow to answer
for one file: a stripe read of the first file waits at that holder's data endpoint (a proxy in
front of it holds the request), and the other files' stripes are cut again, written and
verified on the new holder meanwhile, one file's reads never holding back the rest of its batch.
Released, the held file's stripe is cut too and every set is whole on live nodes.

On the real stack: node workers with their data endpoints (the held holder's behind the proxy
it reports to the catalog), the shared worker, a real Temporal server, the migrated catalog and
the lost node declared as the API declares it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure import Code

from tests.helpers.faults import db_now, eventually, workers_reported_in
from tests.helpers.hold_proxy import hold_proxy
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id
from tierpoint.services import node_lost
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
NODES = tuple(f"node-{i:02d}" for i in range(5))
RANK, LOST, SLOW, OTHER, NEW = NODES
FILES = 4
WORKER_SECRET = "tp_worker-credential-of-this-test"
# Nothing is held until the rebuild: the lifecycle's pulls read through the proxy as they are.
NOTHING = ("\0",)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stripes(sessions: sessionmaker[Session], checkpoint_id: int) -> list[tuple[str, str, str]]:
    """(file, holder, state) of every stripe of the checkpoint."""
    with sessions() as s:
        return [
            (r.path, r.node_id, r.state)
            for r in s.execute(
                select(Shard.path, Stripe.node_id, Stripe.state)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == checkpoint_id)
            )
        ]


async def test_one_files_held_stripe_read_does_not_hold_back_the_rest_of_the_rebuild(
    settings: Settings, sessions: sessionmaker[Session], client: Client, engine: Engine
) -> None:
    job = new_job()
    shards = random_shards([RANK], FILES, 150_000)
    held_file, *rest = sorted(sh.path for sh in shards)
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    since = db_now(engine)
    port = _free_port()
    with hold_proxy(f"http://127.0.0.1:{port}", NOTHING) as proxy:
        slow = settings.model_copy(update={"data_port": port, "data_url": proxy.url})
        async with contextlib.AsyncExitStack() as stack:
            others = [n for n in NODES if n != SLOW]
            await stack.enter_async_context(
                running_workers(settings, client, nodes=others, shared=False)
            )
            await stack.enter_async_context(
                running_workers(slow, client, nodes=[SLOW], shared=False)
            )
            await workers_reported_in(engine, NODES, since)
            await stack.enter_async_context(
                running_workers(settings, client, nodes=(), shared=True)
            )
            await run_lifecycle(client, seeded)
            # The first k+m nodes after the rank's hold its stripes; the next one is spare.
            rows = _stripes(sessions, seeded.checkpoint_id)
            assert {(h, st) for _, h, st in rows} == {
                (n, "verified") for n in (LOST, SLOW, OTHER)
            }, rows

            # Its one other readable stripe is on SLOW: the held file's cut waits for it.
            proxy.hold = (f"{held_file}",)
            engine_async = make_async_engine(settings.database_url, pool_size=1)
            try:
                async with async_sessions(engine_async).begin() as s:
                    declared = await node_lost.declare(s, settings, LOST, "test")
            finally:
                await engine_async.dispose()
            await node_lost.rereplicate(client, declared)

            def on_new(state: str) -> set[str]:
                return {
                    p
                    for p, h, st in _stripes(sessions, seeded.checkpoint_id)
                    if h == NEW and st == state
                }

            async def rest_verified() -> bool:
                return await asyncio.to_thread(on_new, "verified") == set(rest)

            # A rebuild that cuts one file at a time reaches the next only once the held read
            # gave up (its client closed the connection): the rest must be done while it waits.
            await eventually(
                "the other files' stripes verified on the new holder while one read is held",
                rest_verified,
            )
            assert proxy.still_waiting() >= 1 and held_file not in on_new("verified")

            proxy.release()
            handle = client.get_workflow_handle(rereplicate_id(job, 1))
            await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

    rows = _stripes(sessions, seeded.checkpoint_id)
    assert {(h, st) for _, h, st in rows} == {(n, "verified") for n in (NEW, SLOW, OTHER)}, rows
    assert len(rows) == FILES * CODE.width
