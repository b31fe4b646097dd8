"""A lost node that held both a full peer copy and a stripe of a coded peer tier (rs(2,1)) of a
rank's files, on the real stack (node workers with their data endpoints, the shared worker, a
real Temporal server, the migrated catalog): the one re-replication its declaration starts
copies the full copies again and cuts the stripes again at the same time, not one tier after the
other. The coded tier's rebuild is scheduled before the full copies' copy is done, and both
tiers are whole again on live nodes afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure import Code

from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
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
from tierpoint.catalog.models import Node, Replica, Stripe
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import COPY_BATCH
from tierpoint.contract.peer import rereplicate_id
from tierpoint.contract.stripes import REBUILD_BATCH
from tierpoint.services import node_lost
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
NODES = tuple(f"node-{i:02d}" for i in range(6))
RANK = NODES[0]
WORKER_SECRET = "tp_worker-credential-of-this-test"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    ssd, lustre, _ = settings.tiers
    peer = TierConfig(name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"))
    coded = TierConfig(
        name="coded", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/coded"), code=str(CODE)
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, peer, coded, lustre], "data_token": WORKER_SECRET}
    )


def _holders(sessions: sessionmaker[Session], checkpoint_id: int) -> dict[str, set[str]]:
    """Per peer tier, the live nodes holding a verified copy or stripe of the checkpoint."""
    live = select(Node.id).where(Node.lost_at.is_(None))
    with sessions() as s:
        copies = s.scalars(
            select(Replica.node_id).where(
                Replica.checkpoint_id == checkpoint_id,
                Replica.tier == "peer",
                Replica.state == "verified",
                Replica.node_id.in_(live),
            )
        )
        stripes = s.scalars(
            select(Stripe.node_id).where(
                Stripe.checkpoint_id == checkpoint_id,
                Stripe.state == "verified",
                Stripe.node_id.in_(live),
            )
        )
        return {"peer": {n for n in copies if n}, "coded": set(stripes)}


async def test_a_lost_nodes_full_copies_and_stripes_are_made_again_together(
    settings: Settings, sessions: sessionmaker[Session], client: Client, engine: Engine
) -> None:
    job = new_job()
    seeded = seed_checkpoint(settings, sessions, job, 1, random_shards([RANK], 2, 200_000))
    since = db_now(engine)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            running_workers(settings, client, nodes=NODES, shared=False)
        )
        await workers_reported_in(engine, NODES, since)
        # The shared worker refuses a code the nodes it knows cannot hold: it starts after them.
        await stack.enter_async_context(running_workers(settings, client, nodes=(), shared=True))
        await run_lifecycle(client, seeded)
        before = _holders(sessions, seeded.checkpoint_id)
        # The next node of the ring holds the full copy and a stripe of each file.
        lost = NODES[1]
        assert before["peer"] == {lost} and lost in before["coded"], before

        engine_async = make_async_engine(settings.database_url, pool_size=1)
        try:
            async with async_sessions(engine_async).begin() as s:
                declared = await node_lost.declare(s, settings, lost, "test")
        finally:
            await engine_async.dispose()
        await node_lost.rereplicate(client, declared)
        handle = client.get_workflow_handle(rereplicate_id(job, 1))
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        history = await handle.fetch_history()
        if recording_histories():
            await record_history(client, rereplicate_id(job, 1), "peer_rereplicate_with_coded")

    scheduled: dict[int, str] = {}
    order: list[tuple[str, str]] = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = name
            order.append(("scheduled", name))
        elif event.HasField("activity_task_completed_event_attributes"):
            of = event.activity_task_completed_event_attributes.scheduled_event_id
            order.append(("completed", scheduled[of]))
    # The rebuild did not wait for the full copies: scheduled before the copy batch was done.
    assert order.index(("scheduled", REBUILD_BATCH)) < order.index(("completed", COPY_BATCH)), order

    after = _holders(sessions, seeded.checkpoint_id)
    assert len(after["peer"]) == 1 and lost not in after["peer"] | after["coded"], after
    assert len(after["coded"]) == CODE.width and RANK not in after["coded"], after
    states = markers(sessions, seeded.checkpoint_id)
    assert states["peer"][0] == states["coded"][0] == "restorable", states
