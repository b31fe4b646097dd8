"""A restore while the node holding the peer copies is down but not (yet) declared lost: the very
case a peer tier exists for. The holder's worker process, which serves its data endpoint, is
SIGKILLed; the catalog still lists its copies as verified, so the restore plan sends every shard
there. Each read is refused at the connection, and the restore goes on from the shard's next
verified copy, the shared tier's: every file restored and verified, none reported corrupt.

Real services (Temporal dev server, Postgres, moto S3), the API under uvicorn, a real
`tierpoint worker` process for the holder (killed), the source node's and the shared worker in
the test process; the restore is the client's, called as a training job calls it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client import build_manifest

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.client import read_tree, write_shards
from tests.helpers.lifecycle import running_workers
from tests.helpers.peer_faults import peer_settings, replica_states, wait_for_endpoints
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import worker_process
from tierpoint.catalog.models import Checkpoint, Event, Job
from tierpoint.config import Settings

WAIT = 300.0  # hang guard only
KIB = 1024


async def test_a_restore_reads_on_from_the_shared_tier_when_the_peer_holder_is_down(
    settings: Settings, sessions: sessionmaker[Session], client: Client, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: with two live nodes each holds the other's copy.
    source, holder = f"a-{tag}", f"b-{tag}"
    base = peer_settings(settings, tmp_path, [source, holder], later=True)
    job, step = f"peer-down-{tag}", 3
    local = base.tier("ssd").root_for(source) / job / str(step)
    shards = write_shards(local, {"rank0.bin": 700 * KIB, "rank1.bin": 300 * KIB + 5})
    dest = tmp_path / "restored"

    async with running_workers(base, client, nodes=[source], shared=True):
        with worker_process(base, holder, tmp_path / "holder.log") as held:
            await wait_for_endpoints(sessions, [source, holder], 60)
            async with serving(create_app(base)) as api:
                trainer = create_token(base.database_url, scopes=[f"train:{job}"])
                tp = TierpointClient(api, token=trainer)
                manifest = build_manifest(local, source)
                await asyncio.to_thread(tp.register_manifest, job, step, manifest)
                # The shared tier's copy and S3's run side by side: wait for both.
                await asyncio.to_thread(tp.wait_restorable, job, step, "lustre", WAIT, 0.2)
                cp = await asyncio.to_thread(tp.wait_restorable, job, step, "s3", WAIT, 0.2)
                assert {t.tier: t.state for t in cp.tiers}["peer"] == "restorable"
                latest = await asyncio.to_thread(tp.latest, job)
                assert latest is not None
                assert {(e.tier, e.node) for e in latest.plan} == {("peer", holder)}

                assert held.kill() == -9, held.output()
                result = await asyncio.to_thread(tp.restore, job, dest)
                # Down is not lost: the holder's copies are still verified in the catalog, and
                # a copy that could not be read was not reported corrupt.
                checkpoint_id = _checkpoint_id(sessions, job, step)
                assert replica_states(sessions, checkpoint_id, "peer") == ["verified"] * 2
                assert _corrupt_events(sessions, checkpoint_id) == 0

    assert result.step == step
    assert result.tiers_used == {"lustre": len(shards)}
    assert read_tree(dest) == shards


def _checkpoint_id(sessions: sessionmaker[Session], job: str, step: int) -> int:
    with sessions() as s:
        found = s.scalar(
            select(Checkpoint.id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
    assert found is not None
    return found


def _corrupt_events(sessions: sessionmaker[Session], checkpoint_id: int) -> int:
    with sessions() as s:
        return len(
            s.scalars(
                select(Event.id).where(
                    Event.checkpoint_id == checkpoint_id, Event.kind == "corrupt"
                )
            ).all()
        )
