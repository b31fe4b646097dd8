"""A node that held only peer copies of a job's checkpoints is declared lost. It wrote none of the
job's shards, so no byte of the job's local copies went with it: the writer's local copies stay
restorable, a restart on the writer's node restores the newest step from its own disk, the peer
copies the node held are made again elsewhere, and retention expires the old local copies as
usual (a local copy failed for nothing would never be expired, and the disk would fill).

As the attacker met it: ssd -> peer (1, 2 or 3 copies) -> s3 with S3 taking every 2nd step, so
the newest step is only on the writer's ssd and the peer tier; 3 to 5 nodes, with and without
racks. Real services (Temporal dev server, Postgres, moto, the API in the test process), real
files on every node's roots, real workers and data endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import RESULT_TIMEOUT, running_workers
from tests.helpers.peer_faults import (
    checkpoint_id,
    peer_copies,
    peer_settings,
    wait_for_endpoints,
    write_and_register,
)
from tests.helpers.retention import (
    create_job,
    markers,
    settle,
    steps_on_disk,
)
from tests.helpers.services import fresh_database
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

POLICY = {
    "kinds": {"local": {"keep_last": 2}, "peer": {"keep_last": 2}},
    "tiers": {"s3": {"promote_every": 2}},
}
SHARDS = 2


@pytest.fixture
def migrated_url(_template_url: str) -> str:
    """A catalog of each case's own: placement's ring is every node that reported in lately, and
    an earlier case's nodes, which no worker serves now, must not be in it."""
    return fresh_database(_template_url, template=True)


@pytest.mark.parametrize(
    ("copies", "count", "racks"),
    [
        pytest.param(1, 3, None, id="1-copy-3-nodes"),
        pytest.param(2, 4, None, id="2-copies-4-nodes"),
        # a's rack-mate b comes last: its copies go to c, d (other racks) and e.
        pytest.param(3, 5, "11232", id="3-copies-5-nodes-racks"),
    ],
)
async def test_a_lost_node_that_held_only_peer_copies_fails_no_local_copy(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
    copies: int,
    count: int,
    racks: str | None,
) -> None:
    tag = uuid.uuid4().hex[:8]
    nodes = [f"{tag}-{x}" for x in "abcde"[:count]]
    writer = nodes[0]
    domains = {n: f"rack-{r}" for n, r in zip(nodes, racks, strict=False)} if racks else None
    cfg = peer_settings(
        settings, tmp_path, nodes, below=("s3",), copies=copies, failure_domain=domains
    )
    peers = [t.name for t in cfg.peer_tiers()]
    job = f"spare-{tag}"
    create_job(sessions, job, POLICY)
    admin = create_token(cfg.database_url, scopes=["admin"])
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with (
        running_workers(cfg, client, nodes=nodes),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        trainer = TierpointClient(api, token=trainer_token)
        await wait_for_endpoints(sessions, nodes, 60)
        for step in (10, 11):
            await write_and_register(trainer, client, cfg, job, step, [writer], per_node=SHARDS)
        before = markers(sessions, job)
        assert before[(10, "s3")] == "restorable" and (11, "s3") not in before, before
        assert all(before[(s, t)] == "restorable" for s in (10, 11) for t in ["ssd", *peers])
        ten, eleven = (checkpoint_id(sessions, job, s) for s in (10, 11))
        # The holder of the writer's first peer copy: it wrote nothing of the job.
        (holder,) = {c.node for c in peer_copies(sessions, eleven).values()}
        assert holder is not None and holder != writer

        r = await http.post(f"/v1/nodes/{holder}/lost")
        assert r.status_code == 200, r.text
        lost = r.json()
        # Only what the node held: its peer replicas of both steps, and that tier's markers.
        assert (lost["replicas_lost"], lost["markers_failed"]) == (2 * SHARDS, 2), lost
        assert lost["peer_rereplications"] == 2, lost
        state = markers(sessions, job)
        assert (state[(10, "ssd")], state[(11, "ssd")]) == ("restorable", "restorable"), state
        failures = (await http.get("/v1/failures", params={"job": job})).json()["items"]
        assert "ssd" not in {f["tier"] for f in failures}, failures
        # The writer restarting on its own node restores step 11 from its own disk.
        answer = await asyncio.to_thread(trainer.latest, job, node=writer)
        assert answer is not None and answer.step == 11, answer
        assert {e.tier for e in answer.plan} == {"ssd"}, answer.plan

        for step in (10, 11):
            again = client.get_workflow_handle(rereplicate_id(job, step))
            await asyncio.wait_for(again.result(), RESULT_TIMEOUT)
        # Step 12 holds the local tier's keep_last with 11: step 10's local copy expires.
        await write_and_register(trainer, client, cfg, job, 12, [writer], per_node=SHARDS)
        await settle(client, job)

    state = markers(sessions, job)
    assert state[(10, "ssd")] == "expired", state
    assert (state[(11, "ssd")], state[(12, "ssd")]) == ("restorable", "restorable"), state
    assert steps_on_disk(cfg.tier("ssd").root_for(writer), job) == {11, 12}
    assert state[(11, "peer")] == "restorable", state
    for c in peer_copies(sessions, eleven).values():
        assert c.state == "verified" and c.node not in (holder, writer), c
    checked = assert_catalog_matches_tiers(cfg, engine, [ten, eleven])
    assert checked.restorable["ssd"] == 1, checked
