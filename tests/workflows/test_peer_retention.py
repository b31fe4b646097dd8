"""Retention of peer copies on the real stack: the built-in policy keeps the newest 2 on each peer
tier, as on the local tier, and a configured policy that names no rule for a peer tier keeps there
what it keeps on the local tier (its dry run says so). Before, a peer tier without a rule kept
everything: every node's disk or RAM grew by other nodes' checkpoints at every step.

As the attacker met it: ssd -> peer (1 or 2 copies) -> s3, 3 or 4 nodes, the jobs writing a
checkpoint per step through the API; after each step's lifecycle the job's retention runs. Real
services (Temporal dev server, Postgres, moto, the API in the test process), real files, real
workers and data endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import RESULT_TIMEOUT, running_workers
from tests.helpers.peer_faults import peer_settings, wait_for_endpoints, write_and_register
from tests.helpers.retention import create_job, markers, settle, steps_on_disk
from tests.helpers.services import fresh_database
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Checkpoint, Job, Replica
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

STEPS = (1, 2, 3, 4)


@pytest.fixture
def migrated_url(_template_url: str) -> str:
    """A catalog of each case's own: placement's ring is every node that reported in lately, and
    an earlier case's nodes, which no worker serves now, must not be in it."""
    return fresh_database(_template_url, template=True)


@pytest.mark.parametrize(
    ("copies", "count", "policy", "kept"),
    [
        # The built-in policy: local and peer tiers keep the newest 2.
        pytest.param(2, 3, None, {3, 4}, id="built-in-2-copies-3-nodes"),
        pytest.param(1, 4, None, {3, 4}, id="built-in-1-copy-4-nodes"),
        # A policy with a local rule and none for the peer tier: the peer tier keeps the same.
        pytest.param(
            2, 4, {"kinds": {"local": {"keep_last": 1}}}, {4}, id="local-rule-2-copies-4-nodes"
        ),
    ],
)
async def test_peer_copies_expire_with_the_local_tiers_rule(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    copies: int,
    count: int,
    policy: dict[str, Any] | None,
    kept: set[int],
) -> None:
    tag = uuid.uuid4().hex[:8]
    nodes = [f"{tag}-{x}" for x in "abcd"[:count]]
    writers = nodes[:3]
    cfg = peer_settings(settings, tmp_path, nodes, below=("s3",), copies=copies)
    peers = [t.name for t in cfg.peer_tiers()]
    job = f"peerret-{tag}"
    if policy is not None:
        create_job(sessions, job, policy)
    admin = create_token(cfg.database_url, scopes=["admin"])
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with (
        running_workers(cfg, client, nodes=nodes),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, nodes, 60)
        trainer = TierpointClient(api, token=trainer_token)
        for step in STEPS:
            result = await write_and_register(trainer, client, cfg, job, step, writers)
            assert all(t.state == "restorable" for t in result.tiers), result
            await settle(client, job)
        r = await http.post(f"/v1/jobs/{job}/retention/plan", json={})
        assert r.status_code == 200, r.text
        notes = r.json()["plan"]["notes"]

    state = markers(sessions, job)
    for tier in peers:
        held = {s for s in STEPS if state[(s, tier)] == "restorable"}
        assert held == kept, (tier, state)
        assert {s for s in STEPS if state[(s, tier)] == "expired"} == set(STEPS) - kept, state
        # Deleted on the holders: every node's peer root holds only the kept steps.
        root = cfg.tier(tier)
        on_disk = set().union(*(steps_on_disk(root.root_for(n), job) for n in nodes))
        assert on_disk == kept, (tier, on_disk)
    # The most durable tier keeps everything, the local tier what its rule says.
    assert all(state[(s, "s3")] == "restorable" for s in STEPS), state
    assert {s for s in STEPS if state[(s, "ssd")] == "restorable"} == kept, state
    inherited = [n for n in notes if "has no rule in this policy" in n]
    if policy is None:
        assert inherited == [], notes
    else:
        assert len(inherited) == copies, notes
        assert "it keeps what 'ssd' keeps (keep_last=1)" in inherited[0], notes


async def test_a_peer_copy_failed_for_want_of_a_node_is_made_when_an_expiry_frees_one(
    settings: Settings, sessions: sessionmaker[Session], client: Client, tmp_path: Path
) -> None:
    """Two peer copies of node a's shards and one other node: the second copy of each step
    fails (never beside the first). When retention expires step 1's first copy, b is free of
    step 1's shards: step 1's second copy is made there. Step 2's, beside its first, is not."""
    tag = uuid.uuid4().hex[:8]
    nodes = [f"{tag}-a", f"{tag}-b"]
    cfg = peer_settings(settings, tmp_path, nodes, below=("s3",), copies=2)
    job = f"peerfree-{tag}"
    create_job(
        sessions,
        job,
        {"tiers": {"peer": {"keep_last": 1}, "peer.2": {"keep_last": 2}}},
    )
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with running_workers(cfg, client, nodes=nodes), serving(create_app(cfg)) as api:
        await wait_for_endpoints(sessions, nodes, 60)
        trainer = TierpointClient(api, token=trainer_token)
        await write_and_register(trainer, client, cfg, job, 1, nodes[:1])
        await settle(client, job)
        assert markers(sessions, job)[(1, "peer.2")] == "failed"
        await write_and_register(trainer, client, cfg, job, 2, nodes[:1])
        await settle(client, job)
        # Started by the expiry's finish, before the retention run ended.
        remade = client.get_workflow_handle(rereplicate_id(job, 1))
        await asyncio.wait_for(remade.result(), RESULT_TIMEOUT)
        state = markers(sessions, job)

    assert state[(1, "peer")] == "expired", state
    assert state[(1, "peer.2")] == "restorable", state
    assert state[(2, "peer")] == "restorable", state
    assert state[(2, "peer.2")] == "failed", state
    with sessions() as s:
        holders = s.scalars(
            select(Replica.node_id)
            .join(Checkpoint, Checkpoint.id == Replica.checkpoint_id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == 1, Replica.tier == "peer.2")
        )
        assert set(holders) == {nodes[1]}
