"""A holder declared lost while the lifecycle of a checkpoint is still placing its peer copies
(found by the stateful test: K copies on K distinct live nodes once re-replication settles).
Node A's shard goes to B (tier `peer`) and C (`peer.2`), the first two nodes after A in the ring;
D is free.

- B is lost before the lifecycle's copy to it began: nothing of that copy was in the catalog, so
  the declaration neither told the lifecycle (which waited on B's queue, which no worker serves
  any more) nor had the copy made again. The lifecycle is now told, gives the copy up, and the
  copy is made again on D.
- B is lost after its copy was verified, while the copy to C waits: re-replication placed the
  copy again at once on the first node holding none of A's copies, C, beside the copy the
  lifecycle was about to make there. Re-replication now waits until the lifecycle has placed the
  checkpoint's peer copies, and then puts it on D.

Either way the shard ends with two verified copies on two distinct live nodes, neither its own.

By construction, not timing: B and C are `tierpoint worker` processes killed with SIGKILL while
still in the ring (it counts nodes seen in the last 5 minutes), so the copies scheduled on their
queues wait; C is started again only once re-replication has planned, or is waiting to. A, D and
the shared worker run in the test process; the declaration is the API's."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import ShardSpec, crc_hex, markers, running_workers, seed_checkpoint
from tests.helpers.peer_faults import POLL, peer_copies, peer_settings, wait_for_endpoints
from tests.helpers.tokens import bearer, create_token
from tests.helpers.worker_process import WorkerProcess, worker_process
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, workflow_id
from tierpoint.contract.peer import PLAN, rereplicate_id
from tierpoint.temporal import start_lifecycle

SHARD = "rank0.bin"
STEP = 4
WAIT = 180.0  # hang guard only


async def _until(what: str, done: Callable[[], Awaitable[bool]]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not await done():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(POLL)


async def _scenario(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    *,
    b_copies_first: bool,
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b, c, d = (f"{tag}-{x}" for x in "abcd")
    base = peer_settings(settings, tmp_path, [a, b, c, d], copies=2)
    job = f"placing-{tag}"
    data = os.urandom(40_000)
    admin = create_token(base.database_url, scopes=["admin"])

    async with (
        running_workers(base, client, nodes=[a, d], shared=True),
        serving(create_app(base)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        b_worker = WorkerProcess(base, b, tmp_path / "b.log")
        c_worker = WorkerProcess(base, c, tmp_path / "c.log")
        try:
            await wait_for_endpoints(sessions, [a, b, c, d], 60)
            assert c_worker.kill() == -9, c_worker.output()
            if not b_copies_first:
                assert b_worker.kill() == -9, b_worker.output()
            seeded = seed_checkpoint(
                base, sessions, job, STEP, [ShardSpec(a, SHARD, data, crc_hex(data))]
            )
            cid = seeded.checkpoint_id
            await start_lifecycle(client, LifecycleInput(checkpoint_id=cid, job=job, step=STEP))
            # Sealed, and the copy to B under way (waiting on B's queue), or made.
            want = "restorable" if b_copies_first else "pending"
            await _until(
                f"peer {want} after the seal",
                lambda: _states(sessions, cid, ("ssd", "restorable"), ("peer", want)),
            )
            r = await http.post(f"/v1/nodes/{b}/lost")
            assert r.status_code == 200, r.text
            assert r.json()["peer_rereplications"] == 1, r.text
            # B's disks are gone; its worker with them.
            b_worker.kill()
            await _until("re-replication planned or waiting", lambda: _planned(client, job))
            with worker_process(base, c, tmp_path / "c-again.log"):
                await asyncio.wait_for(
                    client.get_workflow_handle(workflow_id(job, STEP)).result(), WAIT
                )
                await asyncio.wait_for(
                    client.get_workflow_handle(rereplicate_id(job, STEP)).result(), WAIT
                )
        finally:
            b_worker.kill()
            c_worker.kill()

    held = {t: peer_copies(sessions, cid, t)[SHARD] for t in ("peer", "peer.2")}
    assert {t: (p.node, p.state) for t, p in held.items()} == {
        "peer": (d, "verified"),
        "peer.2": (c, "verified"),
    }, held
    assert {t: s for t, (s, _) in markers(sessions, cid).items()} == {
        "ssd": "restorable",
        "peer": "restorable",
        "peer.2": "restorable",
    }


async def _states(sessions: sessionmaker[Session], cid: int, *want: tuple[str, str]) -> bool:
    now = markers(sessions, cid)
    return all(now.get(t, ("none", None))[0] == s for t, s in want)


async def _planned(client: Client, job: str) -> bool:
    """The re-replication has planned (a copy waits to be taken), or its plan was refused at
    least once: either way C must not serve before it decided."""
    desc = await client.get_workflow_handle(rereplicate_id(job, STEP)).describe()
    pending = desc.raw_description.pending_activities
    return any(p.activity_type.name != PLAN or p.attempt > 1 for p in pending)


async def test_a_holder_lost_before_its_copy_began_is_replaced(
    settings: Settings, sessions: sessionmaker[Session], client: Client, tmp_path: Path
) -> None:
    await _scenario(settings, sessions, client, tmp_path, b_copies_first=False)


async def test_a_copy_made_again_waits_for_the_lifecycle_to_place_the_others(
    settings: Settings, sessions: sessionmaker[Session], client: Client, tmp_path: Path
) -> None:
    await _scenario(settings, sessions, client, tmp_path, b_copies_first=True)
