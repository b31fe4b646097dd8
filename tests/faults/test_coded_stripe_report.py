"""A stripe a restore found corrupt, reported to the server on real services (rs(2,1) on four
node workers with their data endpoints, the shared worker, a real Temporal server, the API under
uvicorn, the client in this process): a held data stripe with a flipped byte at rest is read
around by the client's restore (bytes equal), reported with its index, read back on its holder
by the server, and only then moved `found bad`; the coded copy keeps k and stays restorable, and
the rebuild the holder's read asked for cuts the stripe again. A report of a stripe whose bytes
are good is read back and changes nothing: the server never takes the reader's word alone. A
stripe named on a tier of whole copies is refused and changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client.errors import NotFoundError

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.coded_tier import NODES, SECRET, coded_settings, coded_stack, rebuilt
from tests.helpers.integrity import events
from tests.helpers.lifecycle import (
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    seed_checkpoint,
)
from tests.helpers.tokens import create_token
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.config import Settings

SOURCES = ("node-a", "node-b")


@pytest.fixture
def cfg(settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(settings, tmp_path, below=("lustre",), data_token=SECRET)


def _stripes(sessions: sessionmaker[Session], cp: int) -> dict[tuple[str, int], tuple[str, str]]:
    """(shard path, index) -> (holder, state)."""
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Stripe.stripe_index, Stripe.node_id, Stripe.state)
            .join(Shard, Shard.id == Stripe.shard_id)
            .where(Stripe.checkpoint_id == cp)
        ).all()
    return {(r.path, r.stripe_index): (r.node_id, r.state) for r in rows}


async def test_a_stripe_the_restore_found_corrupt_is_reported_and_confirmed_on_its_holder(
    cfg: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    job = new_job()
    shards = random_shards(SOURCES, 1, 200_003)
    seeded = seed_checkpoint(cfg, sessions, job, 1, shards)
    cp = seeded.checkpoint_id
    trainer = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with coded_stack(cfg, client, engine, NODES):
        await run_lifecycle(client, seeded)
        assert markers(sessions, cp)["coded"][0] == "restorable"
        target, other = shards
        holder, _ = _stripes(sessions, cp)[(target.path, 0)]
        held = cfg.tier("coded").root_for(holder) / job / "1" / target.path
        data = bytearray(held.read_bytes())
        data[100] ^= 0x04
        held.write_bytes(bytes(data))

        async with serving(create_app(cfg)) as api:
            tp = TierpointClient(api, token=trainer)
            # A reader on no node of the job: the coded copy is the first tier it reads.
            restored = await asyncio.to_thread(tp.restore, job, tmp_path / "restore")
            assert {f.path: f.tier for f in restored.files} == dict.fromkeys(
                (sh.path for sh in shards), "coded"
            )
            for sh in shards:
                assert (tmp_path / "restore" / sh.path).read_bytes() == sh.data
            # Reported, read back on the holder, confirmed: moved `found bad`; the rebuild that
            # the holder's read asked for cut it again there (no other node is free of the set).
            found = [d for _, t, d in events(engine, cp, "corrupt") if t == "coded"]
            assert [d["stripes"] for d in found] == [1], found
            assert markers(sessions, cp)["coded"][0] == "restorable"
            (reported,) = [d for _, t, d in events(engine, cp, "corrupt_reported") if t == "coded"]
            assert (reported["path"], reported["stripe"]) == (target.path, 0), reported
            await rebuilt(client, job)
            assert _stripes(sessions, cp)[(target.path, 0)] == (holder, "verified")

            # A report of a good stripe: read back on its holder, found good, nothing moves.
            answer = await asyncio.to_thread(
                tp.report_corrupt_copy, job, 1, "coded", other.path, "I say so", stripe=1
            )
            assert answer["verification"] == "not confirmed", answer
            assert answer["replica_state"] == "verified", answer
            assert _stripes(sessions, cp)[(other.path, 1)][1] == "verified"
            # The confirmed one again, since cut again: read back good, nothing moves.
            again = await asyncio.to_thread(
                tp.report_corrupt_copy, job, 1, "coded", target.path, "again", stripe=0
            )
            assert again["verification"] == "not confirmed", again
            assert _stripes(sessions, cp)[(target.path, 0)] == (holder, "verified")

            # A stripe on a tier of whole copies: refused, nothing recorded.
            with pytest.raises(NotFoundError) as refused:
                await asyncio.to_thread(
                    tp.report_corrupt_copy, job, 1, "ssd", other.path, "no", stripe=0
                )
            assert refused.value.code == "copy_not_found"
            assert len(events(engine, cp, "corrupt_reported")) == 3
