"""The scrub of a coded tier's stripes on their holder (activities/scrub_stripes.py through
`scrub.pick` and `scrub.verify_batch`), on the holder's worker with a real catalog and real
files: its verified stripes picked and read back good, counted once per pick; a stripe with a
flipped byte, one of another size and one gone found `corrupt`, `corrupt` and `lost`, never
counted again; a unit on another node reads nothing of this holder."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment
from tierpoint_client.peer import PEERS

from activities.scrub import ScrubActivities
from activities.stores import Stores
from tests.helpers.coded_tier import STEP, coded_settings, holders_a, pull, ready, stripe_states
from tierpoint.config import Settings
from tierpoint.contract.integrity import ScrubBatchInput, ScrubPickInput, ScrubUnit
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.tier_config import TierKind

SECRET = "tp_worker-credential-of-this-test"


@pytest.fixture
def coded(catalog_settings: Settings, tmp_path: Path) -> Settings:
    s = coded_settings(catalog_settings, tmp_path, data_token=SECRET)
    return s.model_copy(update={"scrub_min_age": timedelta(0)})


@pytest.fixture
def server(coded: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(coded, sessions, "node-a", 0)
    yield srv
    srv.shutdown()
    srv.server_close()
    PEERS.close()


def _unit(node: str) -> ScrubUnit:
    return ScrubUnit(
        tier="coded", kind=TierKind.PEER, node=node, bandwidth=0, budget=1 << 40, min_age_seconds=0
    )


def test_a_holders_unit_reads_its_stripes_and_finds_rot_resizing_and_loss(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 50_000)
    holder, other = holders_a()[:2]
    assert pull(coded, sessions, cp, job, holder).verified == 3
    acts = ScrubActivities(sessions, coded, Stores(coded), node=holder)
    env = ActivityEnvironment()

    def scrub() -> tuple[int, int, int, int, int]:
        pick = env.run(acts.pick, ScrubPickInput(unit=_unit(holder), budget=1 << 40))
        assert pick.replica_ids == []
        inp = ScrubBatchInput(
            tier="coded",
            node=holder,
            replica_ids=[],
            stripe_ids=pick.stripe_ids,
            bandwidth=0,
            picked_at=pick.picked_at,
        )
        res = env.run(acts.verify_batch, inp)
        return len(pick.stripe_ids), res.stripes, res.corrupt, res.lost, res.skipped

    # Only the stripes this holder holds, and verified: one per shard.
    assert scrub() == (3, 3, 0, 0, 0)
    # The other holder has pulled nothing yet: its unit picks nothing.
    empty = env.run(acts.pick, ScrubPickInput(unit=_unit(other), budget=1 << 40))
    assert empty.stripe_ids == [] and empty.replica_ids == []

    root = coded.tier("coded").root_for(holder) / job / str(STEP)
    flipped = root / shards[0].path
    data = bytearray(flipped.read_bytes())
    data[7] ^= 0x80
    flipped.write_bytes(bytes(data))
    (root / shards[1].path).write_bytes(b"short")
    (root / shards[2].path).unlink()
    assert scrub() == (3, 0, 2, 1, 0)
    states = stripe_states(sessions, cp)
    assert [states[(sh.path, 0)] for sh in shards] == ["corrupt", "corrupt", "lost"]
    # Found bad once: nothing of them is due again.
    assert scrub() == (0, 0, 0, 0, 0)
