"""A stripe found bad is cut again without waiting for a node loss, on real services (rs(2,1) on
five node workers with their data endpoints, the shared worker, a real Temporal server, the
catalog with its migrations, the API under uvicorn, the client in this process).

A byte flipped at rest in a held stripe: the scrub on its holder finds it and moves it `found
bad`, then asks for the checkpoint's rebuild, whose plan re-places the stripe on the one node
that holds no stripe of its set and cuts it again there from the others. It ends verified with
the encoder's crc32c; the coded copy stays restorable throughout, and a restore from the stripes
gives the files back byte for byte. An operator's verify of the coded copy does the same for a
stripe it reads back bad. A stripe marked bad whose ask was lost (its finder died after the
commit) is cut again when a repair of the checkpoint is asked for: the repair routes a coded
copy's bad stripes to the same rebuild. And retention, under a policy tightened while a rebuild
reads the copy's stripes, keeps the copy until the rebuild ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client.erasure import Code
from tierpoint_client.hashing import file_crc32c

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.cli import serving
from tests.helpers.coded_tier import rebuilt, verify_coded
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.integrity import events, integrity_settings, repair_result, run_scrub
from tests.helpers.lifecycle import (
    Seeded,
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.retention import create_job, set_policy, settle, wait_for
from tests.helpers.retention import markers as retention_markers
from tests.helpers.tokens import create_token
from tierpoint.catalog.models import Job, Shard, Stripe, TierCopy
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.config import Settings
from tierpoint.states import ReplicaState
from tierpoint.temporal import request_repair
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
# node-a's set is held by three of the others; the fifth holds none of it and takes a stripe
# found bad.
NODES = ("node-a", "node-b", "node-c", "node-d", "node-e")
SIZE = 300_001


@pytest.fixture
def cfg(settings: Settings, tmp_path: Path) -> Settings:
    """ssd -> coded -> lustre; only the coded tier is scrubbed."""
    ssd, lustre, _ = integrity_settings(settings).tiers
    coded = TierConfig(
        name="coded",
        kind=TierKind.PEER,
        root=str(tmp_path / "nodes/{node}/coded"),
        code=str(CODE),
        scrub_bandwidth=1 << 30,
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    quiet = [t.model_copy(update={"scrub_bandwidth": 0}) for t in (ssd, lustre)]
    return Settings.model_validate(
        {
            **integrity_settings(settings).model_dump(),
            "tiers": [quiet[0], coded, quiet[1]],
            "data_token": "tp_worker-credential-of-this-test",
        }
    )


class Held(NamedTuple):
    id: int
    shard: int
    holder: str
    state: str
    crc32c: str


def _set_of(sessions: sessionmaker[Session], cp: int, path: str) -> dict[int, Held]:
    """The stripe set of the shard at `path`, by index."""
    with sessions() as s:
        rows = s.execute(
            select(Stripe.id, Shard.id, Stripe.node_id, Stripe.state, Stripe.crc32c)
            .add_columns(Stripe.stripe_index)
            .join(Shard, Shard.id == Stripe.shard_id)
            .where(Stripe.checkpoint_id == cp, Shard.path == path)
        ).all()
    return {r.stripe_index: Held(r[0], r[1], r[2], r[3], r[4]) for r in rows}


def _at(cfg: Settings, holder: str, job: str, path: str) -> Path:
    return cfg.tier("coded").root_for(holder) / job / "1" / path


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@asynccontextmanager
async def _restorable_coded_copy(
    cfg: Settings, sessions: sessionmaker[Session], client: Client, engine: Engine
) -> AsyncIterator[Seeded]:
    """Two files of node-a copied to the coded tier by the lifecycle, every worker running."""
    seeded = seed_checkpoint(cfg, sessions, new_job(), 1, random_shards(["node-a"], 2, SIZE))
    since = db_now(engine)
    async with running_workers(cfg, client, nodes=NODES):
        await workers_reported_in(engine, NODES, since)
        await run_lifecycle(client, seeded)
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"
        yield seeded


def _cut_again(
    cfg: Settings, sessions: sessionmaker[Session], seeded: Seeded, before: Held
) -> None:
    """The stripe is verified again with the encoder's crc32c, on a node that holds no other
    stripe of its set, and its file there is those bytes."""
    path = seeded.shards[0].path
    members = _set_of(sessions, seeded.checkpoint_id, path)
    now = next(m for m in members.values() if m.id == before.id)
    assert (now.state, now.crc32c) == ("verified", before.crc32c), now
    assert now.holder != "node-a"
    assert [m.holder for m in members.values()].count(now.holder) == 1, members
    _, crc = file_crc32c(_at(cfg, now.holder, seeded.job, path))
    assert crc == before.crc32c


async def _restore(cfg: Settings, seeded: Seeded, dest: Path) -> None:
    """A reader on no node restores from the stripes (the first tier it reads): equal bytes."""
    trainer = create_token(cfg.database_url, scopes=[f"train:{seeded.job}"])
    async with serving(create_app(cfg)) as api:
        tp = TierpointClient(api, token=trainer)
        restored = await asyncio.to_thread(tp.restore, seeded.job, dest)
    assert {f.tier for f in restored.files} == {"coded"}, restored.files
    for sh in seeded.shards:
        assert (dest / sh.path).read_bytes() == sh.data


def _never_failed(engine: Engine, cp: int) -> None:
    """The coded copy never left `restorable`: no failure recorded on its tier."""
    failed = [d for _, t, d in events(engine, cp, "failed") if t == "coded"]
    assert failed == [], failed


async def test_a_stripe_the_scrub_finds_bad_is_cut_again_and_the_copy_stays_restorable(
    cfg: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    async with _restorable_coded_copy(cfg, sessions, client, engine) as seeded:
        cp, job = seeded.checkpoint_id, seeded.job
        before = _set_of(sessions, cp, seeded.shards[0].path)[0]
        _flip(_at(cfg, before.holder, job, seeded.shards[0].path))

        found = await run_scrub(client, f"scrub-test/{job}/rot")
        assert (found.corrupt, found.lost) == (1, 0), found
        assert markers(sessions, cp)["coded"][0] == "restorable"
        # Read while the rebuild may be under way: whatever stripes are offered give the bytes.
        await _restore(cfg, seeded, tmp_path / "during")

        await rebuilt(client, job)
        _cut_again(cfg, sessions, seeded, before)
        assert markers(sessions, cp)["coded"][0] == "restorable"
        await _restore(cfg, seeded, tmp_path / "after")
        # The rebuilt stripe reads back good on its new holder: nothing found bad any more.
        clean = await run_scrub(client, f"scrub-test/{job}/clean")
        assert (clean.corrupt, clean.lost) == (0, 0), clean
    _never_failed(engine, cp)


async def _verify(cfg: Settings, job: str) -> dict[str, Any]:
    """An operator's `POST .../verify` of the coded copy through an API of its own."""
    async for api in running_client(create_app(cfg)):
        return await verify_coded(api, job)
    raise AssertionError("the API did not start")


async def test_an_operators_verify_and_a_repair_cut_a_coded_copys_bad_stripes_again(
    cfg: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    async with _restorable_coded_copy(cfg, sessions, client, engine) as seeded:
        cp, job = seeded.checkpoint_id, seeded.job
        path = seeded.shards[0].path

        # An operator's read-back of the coded copy finds a rotten stripe and has it cut again.
        first = _set_of(sessions, cp, path)[0]
        _flip(_at(cfg, first.holder, job, path))
        outcome = await _verify(cfg, job)
        assert outcome["corrupt"] == 1, outcome
        await rebuilt(client, job)
        _cut_again(cfg, sessions, seeded, first)

        # A stripe marked bad whose finder died before it asked: a repair of the checkpoint
        # (asked by an operator's verify of another tier, a reconciliation, an endpoint) asks.
        second = _set_of(sessions, cp, path)[1]
        _flip(_at(cfg, second.holder, job, path))
        with sessions.begin() as s:
            mark_stripes_damaged(
                s, "coded", CODE, {(second.shard, 1): "rotten"}, ReplicaState.CORRUPT, "test"
            )
        await request_repair(client, cp, job, 1, "asked by the test")
        repaired = await repair_result(client, seeded)
        assert repaired.checkpoint_id == cp, repaired
        await rebuilt(client, job)
        _cut_again(cfg, sessions, seeded, second)
        assert markers(sessions, cp)["coded"][0] == "restorable"
        await _restore(cfg, seeded, tmp_path / "after")
    _never_failed(engine, cp)


def _hold(sessions: sessionmaker[Session], job: str, step: int) -> list[str] | None:
    with sessions() as s:
        return s.scalar(
            select(TierCopy.rebuild_from)
            .join(Job, Job.id == TierCopy.job_id)
            .where(Job.name == job, TierCopy.step == step, TierCopy.tier == "coded")
        )


async def _retention_plan(cfg: Settings, job: str) -> dict[str, Any]:
    async for api in running_client(create_app(cfg)):
        r = await api.post(f"/v1/jobs/{job}/retention/plan")
        assert r.status_code == 200, r.text
        plan: dict[str, Any] = r.json()["plan"]
        return plan
    raise AssertionError("the API did not start")


async def test_retention_keeps_a_coded_copy_while_its_rebuild_reads_its_stripes(
    cfg: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
) -> None:
    """A policy tightened while a rebuild cuts a stripe again from the copy's other stripes: the
    copy is kept (`rebuild_source`) until the rebuild ends, which it does, verified; then the
    policy has its way."""
    job = new_job()
    policy_id = create_job(sessions, job, {})
    one, two = (
        seed_checkpoint(cfg, sessions, job, step, random_shards(["node-a"], 2, SIZE))
        for step in (1, 2)
    )
    since = db_now(engine)
    async with running_workers(cfg, client, nodes=NODES):
        await workers_reported_in(engine, NODES, since)
        for seeded in (one, two):
            await run_lifecycle(client, seeded)
    path = one.shards[0].path
    before = _set_of(sessions, one.checkpoint_id, path)[0]
    _flip(_at(cfg, before.holder, job, path))

    # node-e, the one node free of the set, is reported in but its worker is away: the stripe
    # re-placed on it waits there to be cut again.
    async with running_workers(cfg, client, nodes=NODES[:-1]):
        outcome = await _verify(cfg, job)
        assert outcome["corrupt"] == 1, outcome
        await wait_for(lambda: _set_of(sessions, one.checkpoint_id, path)[0].holder == "node-e")
        assert _hold(sessions, job, 1) == ["coded"]

        # The policy now keeps only tagged checkpoints on the coded tier (none is): step 1's
        # copy is kept while its rebuild reads it, step 2's goes.
        set_policy(sessions, policy_id, {"tiers": {"coded": {"keep_tags": ["kept"]}}})
        plan = await _retention_plan(cfg, job)
        keeps = {(k["tier"], k["step"]): k["reasons"] for k in plan["keeps"]}
        assert keeps[("coded", 1)] == ["rebuild_source"], plan
        await settle(client, job)
        state = retention_markers(sessions, job)
        assert (state[(1, "coded")], state[(2, "coded")]) == ("restorable", "expired"), state

        async with running_workers(cfg, client, nodes=NODES[-1:], shared=False):
            await rebuilt(client, job)
            _cut_again(cfg, sessions, one, before)
            assert _hold(sessions, job, 1) is None
            # Rebuilt: the hold is gone, and so is the copy the policy no longer wants.
            await settle(client, job)
            await wait_for(lambda: retention_markers(sessions, job)[(1, "coded")] == "expired")
    _never_failed(engine, one.checkpoint_id)
