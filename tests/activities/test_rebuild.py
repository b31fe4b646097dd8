"""A coded copy's rebuild after a holder was lost (activities/peer_coded.py, activities/rebuild.py)
on a real catalog, real files and the holders' real data endpoints over HTTP: the plan gives the
lost stripe a new holder that holds no stripe of its set and moves it there in the catalog; the
new holder cuts it again from k others, byte for byte the encoder's, reads it back and is
verified, and the set is whole; a set with fewer than k readable others now fails the attempt
(retried) and writes nothing; a stripe that would not be the encoder's is never written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from tierpoint_client.peer import PEERS

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.peer import PeerActivities
from activities.rebuild import SHORT_OF_K, RebuildActivities
from activities.stores import Stores
from tests.helpers.coded_tier import (
    CODE,
    STEP,
    coded_settings,
    holders_a,
    pull,
    ready,
    staged_file,
    stripe_states,
)
from tierpoint.catalog.models import Node, Shard, Stripe, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, BatchResult, PromoteInput
from tierpoint.contract.peer import PeerPlan, RereplicateInput
from tierpoint.contract.stripes import EncodeInput, RebuildInput
from tierpoint.services.data_endpoint import DataServer, serve

SECRET = "tp_worker-credential-of-this-test"
SPARE = "node-e"


@pytest.fixture
def coded(catalog_settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(catalog_settings, tmp_path, data_token=SECRET)


@pytest.fixture
def servers(coded: Settings, sessions: sessionmaker[Session]) -> Iterator[dict[str, DataServer]]:
    """Every node's data endpoint: node-a's staging area, the holders' stripes, the spare's."""
    running = {n: serve(coded, sessions, n, 0) for n in ("node-a", *holders_a(), SPARE)}
    yield running
    for srv in running.values():
        srv.shutdown()
        srv.server_close()
    PEERS.close()


def _whole(
    coded: Settings, sessions: sessionmaker[Session], servers: dict[str, DataServer]
) -> tuple[int, str, list[str]]:
    """node-a's three files (two segments and a bit) cut, pulled by their holders, promoted,
    unstaged; every node serving its endpoint."""
    with sessions.begin() as s:
        # The module's catalog is shared: a node an earlier test declared lost is a fresh one here.
        s.execute(update(Node).where(Node.id.in_(list(servers))).values(lost_at=None))
    cp, job, shards = ready(coded, sessions, servers["node-a"], 5 * 1024 * 1024 + 7)
    with sessions.begin() as s:
        for node, srv in servers.items():
            upsert_node(s, node, {}, data_url=srv.url)
    for holder in holders_a():
        assert pull(coded, sessions, cp, job, holder).verified == 3
    lifecycle = LifecycleActivities(sessions, coded, Stores(coded))
    got = ActivityEnvironment().run(lifecycle.promote, PromoteInput(checkpoint_id=cp, tier="coded"))
    assert got.state == "restorable"
    # The staging area gives the whole sets up: a rebuild reads the holders alone.
    encoder = EncodeActivities(sessions, coded, Stores(coded), node="node-a")
    unstage = EncodeInput(
        checkpoint_id=cp,
        job=job,
        step=STEP,
        batch=Batch(node="node-a", first=0, last=2),
        source="ssd",
        tier="coded",
    )
    assert ActivityEnvironment().run(encoder.unstage_batch, unstage).verified == 3
    assert not [p for p in staged_file(coded, job, 0, "").parent.rglob("*") if p.is_file()]
    return cp, job, [sh.path for sh in shards]


def _lose(coded: Settings, sessions: sessionmaker[Session], node: str) -> None:
    with sessions.begin() as s:
        mark_lost(s, node, ["ssd"], "test", ["coded"], {"coded": CODE})


def _plan(coded: Settings, sessions: sessionmaker[Session], cp: int, job: str) -> PeerPlan:
    acts = PeerActivities(sessions, coded, Stores(coded))
    inp = RereplicateInput(checkpoint_id=cp, job=job, step=STEP)
    return ActivityEnvironment().run(acts.plan, inp)


def _rebuild(
    coded: Settings, sessions: sessionmaker[Session], cp: int, job: str, batch: Batch
) -> BatchResult:
    assert batch.holder is not None
    acts = RebuildActivities(sessions, coded, Stores(coded), node=batch.holder)
    inp = RebuildInput(checkpoint_id=cp, job=job, step=STEP, batch=batch, tier="coded")
    return ActivityEnvironment().run(acts.rebuild_batch, inp)


def _held(coded: Settings, node: str, job: str, path: str) -> Path:
    return coded.tier("coded").root_for(node) / job / str(STEP) / path


def test_a_lost_holders_stripes_are_cut_again_on_a_node_holding_none_of_the_set(
    coded: Settings, sessions: sessionmaker[Session], servers: dict[str, DataServer]
) -> None:
    cp, job, paths = _whole(coded, sessions, servers)
    holders = holders_a()
    originals = {p: _held(coded, holders[1], job, p).read_bytes() for p in paths}
    _lose(coded, sessions, holders[1])
    assert {st for (_, i), st in stripe_states(sessions, cp).items() if i == 1} == {"lost"}

    plan = _plan(coded, sessions, cp, job)
    (stage,) = plan.stages
    assert stage.tier.code == str(CODE) and stage.unplaced == [] and stage.unreachable == 0
    # The spare: node-a's own node and the set's other holders are never it.
    assert {(b.node, b.holder, b.source_tier) for b in stage.batches} == {
        ("node-a", SPARE, "coded")
    }
    assert {st for (_, i), st in stripe_states(sessions, cp).items() if i == 1} == {"pending"}
    # The plan holds the copy the rebuild reads, its own stripes; a batch renews that hold, as a
    # copy batch renews its sources': a rebuild longer than one hold is never expired under it.
    with sessions.begin() as s:
        s.execute(
            update(TierCopy)
            .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "coded")
            .values(rebuild_until=func.now())
        )
    for batch in stage.batches:
        got = _rebuild(coded, sessions, cp, job, batch)
        assert (got.verified, got.corrupt) == (got.shards, 0), got
    with sessions() as s:
        held, lasts = s.execute(
            select(
                TierCopy.rebuild_from, TierCopy.rebuild_until > func.now() + timedelta(hours=1)
            ).where(TierCopy.checkpoint_id == cp, TierCopy.tier == "coded")
        ).one()
    assert held == ["coded"] and lasts, (held, lasts)
    for p in paths:
        assert _held(coded, SPARE, job, p).read_bytes() == originals[p]
    assert set(stripe_states(sessions, cp).values()) == {"verified"}
    with sessions() as s:
        assert coverage(CODE, verified_stripes(s, cp, "coded")).promotable
    # Run again (a retried activity): nothing is read, and a new plan has nothing to rebuild.
    again = _rebuild(coded, sessions, cp, job, stage.batches[0])
    assert (again.skipped, again.bytes) == (again.shards, 0)
    assert _plan(coded, sessions, cp, job).stages == []


def test_a_set_short_of_k_readable_stripes_fails_the_attempt_and_writes_nothing(
    coded: Settings, sessions: sessionmaker[Session], servers: dict[str, DataServer]
) -> None:
    cp, job, paths = _whole(coded, sessions, servers)
    holders = holders_a()
    _lose(coded, sessions, holders[1])
    # A byte flipped at rest in holders[0]'s stripe of the first file: with holders[1] lost,
    # its set has one good stripe besides it, and rs(2,1) needs two.
    rotten = _held(coded, holders[0], job, paths[0])
    was = rotten.read_bytes()
    rotten.write_bytes(was[:10] + bytes([was[10] ^ 0x04]) + was[11:])
    (stage,) = _plan(coded, sessions, cp, job).stages
    (batch,) = stage.batches
    with pytest.raises(ApplicationError) as err:
        _rebuild(coded, sessions, cp, job, batch)
    assert err.value.type == SHORT_OF_K and not err.value.non_retryable
    assert not _held(coded, SPARE, job, paths[0]).exists()
    states = stripe_states(sessions, cp)
    assert states[(paths[0], 1)] == "pending"
    assert [states[(p, 1)] for p in paths[1:]] == ["verified", "verified"]
    # The holder's stripe mended (repair's work): the retry cuts the last one.
    rotten.write_bytes(was)
    got = _rebuild(coded, sessions, cp, job, batch)
    assert (got.verified, got.skipped) == (3, 2), got
    assert set(stripe_states(sessions, cp).values()) == {"verified"}


def test_a_stripe_cut_again_other_than_the_encoder_recorded_is_never_written(
    coded: Settings, sessions: sessionmaker[Session], servers: dict[str, DataServer]
) -> None:
    cp, job, paths = _whole(coded, sessions, servers)
    holders = holders_a()
    _lose(coded, sessions, holders[2])
    (stage,) = _plan(coded, sessions, cp, job).stages
    # The catalog says the encoder cut other bytes for the first file's parity stripe (as a
    # codec that changed its format would): the stripe cut now is not those.
    with sessions.begin() as s:
        s.execute(
            update(Stripe)
            .where(
                Stripe.shard_id == Shard.id,
                Shard.checkpoint_id == cp,
                Shard.path == paths[0],
                Stripe.stripe_index == 2,
            )
            .values(crc32c="0badf00d")
        )
    (batch,) = stage.batches
    got = _rebuild(coded, sessions, cp, job, batch)
    assert (got.verified, got.corrupt) == (2, 1), got
    assert "0badf00d" in got.problems[0]
    assert not _held(coded, SPARE, job, paths[0]).exists()
    assert stripe_states(sessions, cp)[(paths[0], 2)] == "pending"
