"""Retention while a peer copy is made again from the tier below: a node and the holder of its
peer copy are both lost, so re-replication reads the node's shards from the shared tier. A
retention run while those copies wait for their new holder (its worker is away) keeps the shared
copy that the policy no longer wants (`rebuild_source`, shown in the dry run); once the peer tier
is restorable again the hold is released and the next run expires that copy.

Real services (Temporal dev server, Postgres, moto, the API in the test process); the nodes'
workers and the shared worker in the test process, over real data endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import RESULT_TIMEOUT, random_shards, run_lifecycle, running_workers
from tests.helpers.lifecycle import seed_checkpoint as seed
from tests.helpers.peer_faults import copied_events, peer_copies, peer_settings, wait_for_endpoints
from tests.helpers.pending import NO_COPY, pending_copy
from tests.helpers.retention import create_job, markers, set_policy, settle, wait_for
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import TierCopy
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

SIZE = 16 * 1024 + 5
KEEP_ALL: dict[str, object] = {}
LUSTRE_LAST_1 = {"tiers": {"lustre": {"keep_last": 1}}}


def _hold(sessions: sessionmaker[Session], checkpoint_id: int) -> list[str] | None:
    with sessions() as s:
        return s.scalar(
            select(TierCopy.rebuild_from).where(
                TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == "peer"
            )
        )


async def test_retention_keeps_the_shared_copy_a_rereplication_reads_until_it_is_done(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: a -> b -> c -> d -> a. a's copies are on b, c's on d.
    a, b, c, d = (f"{tag}-{x}" for x in "abcd")
    base = peer_settings(settings, tmp_path, [a, b, c, d], later=True)
    job = f"rebuild-{tag}"
    policy_id = create_job(sessions, job, KEEP_ALL)
    one = seed(base, sessions, job, 1, random_shards([a], 2, SIZE))
    two = seed(base, sessions, job, 2, random_shards([c], 2, SIZE))
    admin = create_token(base.database_url, scopes=["admin"])
    async with running_workers(base, client, nodes=[a, b, c, d], shared=True):
        await wait_for_endpoints(sessions, [a, b, c, d], 60)
        for seeded in (one, two):
            result, _ = await run_lifecycle(client, seeded)
            assert {t.state for t in result.tiers} == {"restorable"}, result
        assert {cp.node for cp in peer_copies(sessions, one.checkpoint_id).values()} == {b}

    # Only the shared worker now: c and d, the live ring, are reported in but not serving, so
    # the re-copies placed on them wait.
    rerep = client.get_workflow_handle(rereplicate_id(job, 1))
    async with (
        running_workers(base, client, nodes=[], shared=True),
        serving(create_app(base)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        for node in (a, b):
            r = await http.post(f"/v1/nodes/{node}/lost")
            assert r.status_code == 200, r.text
        assert markers(sessions, job)[(1, "peer")] == "failed"
        # Planned: its batches wait on the new holder's queue.
        for _ in range(600):
            if await pending_copy(client, rerep) != NO_COPY:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the re-replication never planned a copy")

        # The policy now lets step 1's shared copy go (step 2 is newer there).
        set_policy(sessions, policy_id, LUSTRE_LAST_1)
        outcome = await settle(client, job)
        assert outcome.failed == 0, outcome
        assert markers(sessions, job)[(1, "lustre")] == "restorable"
        body = (await http.post(f"/v1/jobs/{job}/retention/plan")).json()
        keeps = {(k["tier"], k["step"]): k["reasons"] for k in body["plan"]["keeps"]}
        assert keeps[("lustre", 1)] == ["rebuild_source"], body
        assert not [e for e in body["plan"]["expiries"] if e["step"] == 1], body

        async with running_workers(base, client, nodes=[c, d], shared=False):
            await asyncio.wait_for(rerep.result(), RESULT_TIMEOUT)
        state = markers(sessions, job)
        assert state[(1, "peer")] == "restorable", state
        assert _hold(sessions, one.checkpoint_id) is None
        sources = {e["source"] for e in copied_events(sessions, one.checkpoint_id, "peer")}
        assert "lustre" in sources, sources

        # Made: the hold is gone, and so is the copy nobody wants any more.
        await settle(client, job)
        await wait_for(lambda: markers(sessions, job)[(1, "lustre")] == "expired")
    assert markers(sessions, job)[(1, "s3")] == "restorable"
