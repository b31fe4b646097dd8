"""The scrub of a coded peer tier (rs(2,1)) on real services: four node workers with their data
endpoints, the project's shared worker, a real Temporal server, the catalog with its migrations.
Each holder reads back from its own device the stripes it holds and checks each against the size
and crc32c its encoder recorded. A stripe with a flipped byte at rest is found and moved `found
bad`: its set keeps k, so the coded copy stays restorable, and the checkpoint's rebuild that the
scrub asked for cuts the stripe again (on four nodes none is free of the set: on its own holder,
over the bad file), verified with the encoder's crc32c. An operator's read-back of the coded
copy reads every verified stripe on its holder and finds a rotten one as the scrub does. Two
stripes of one set gone at once leave it below k: the coded copy fails and `latest` names the
next tier. The scrub's result, the workers' metrics and `GET /v1/scrub` count stripes, and a
scrub run again counts no stripe found bad twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.hashing import file_crc32c

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.coded_tier import (
    NODES,
    SECRET,
    coded_settings,
    coded_stack,
    rebuilt,
    verify_coded,
)
from tests.helpers.integrity import events, integrity_settings, run_scrub
from tests.helpers.lifecycle import (
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    seed_checkpoint,
)
from tests.helpers.services import with_tier
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.config import Settings

SOURCES = ("node-a", "node-b")
WIDTH = 3  # rs(2,1)


@pytest.fixture
def cfg(settings: Settings, tmp_path: Path) -> Settings:
    """ssd -> coded -> lustre; only the coded tier is scrubbed, so the findings are its own."""
    coded = coded_settings(
        integrity_settings(settings),
        tmp_path,
        below=("lustre",),
        tier={"scrub_bandwidth": 1 << 30},
        data_token=SECRET,
    )
    return with_tier(coded, "lustre", scrub_bandwidth=0)


class _Counts(dict[str, float]):
    def __sub__(self, other: _Counts) -> dict[str, float]:
        return {k: self[k] - other[k] for k in self}


def _scrubbed() -> _Counts:
    """The workers' (in this process) count of coded stripes scrubbed, by what was found."""
    return _Counts(
        {
            r: REGISTRY.get_sample_value(
                "tierpoint_worker_stripes_scrubbed_total", {"tier": "coded", "result": r}
            )
            or 0.0
            for r in ("good", "corrupt", "lost")
        }
    )


def _whole_again(
    sessions: sessionmaker[Session], cfg: Settings, cp: int, job: str, path: str
) -> None:
    """Every stripe of the shard at `path` verified with the encoder's crc32c, each file on its
    holder those bytes."""
    with sessions() as s:
        rows = s.execute(
            select(Stripe.node_id, Stripe.state, Stripe.crc32c)
            .join(Shard, Shard.id == Stripe.shard_id)
            .where(Stripe.checkpoint_id == cp, Shard.path == path)
        ).all()
    assert sorted(state for _, state, _ in rows) == ["verified"] * WIDTH, rows
    for node, _, crc in rows:
        _, read = file_crc32c(cfg.tier("coded").root_for(node) / job / "1" / path)
        assert read == crc, (node, read, crc)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


async def test_the_scrub_reads_each_stripe_on_its_holder_and_fails_a_set_below_k(
    cfg: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
) -> None:
    job = new_job()
    shards = random_shards(SOURCES, 2, 300_001)
    seeded = seed_checkpoint(cfg, sessions, job, 1, shards)
    cp = seeded.checkpoint_id
    coded = cfg.tier("coded")
    async with coded_stack(cfg, client, engine, NODES):
        await run_lifecycle(client, seeded)
        assert markers(sessions, cp)["coded"][0] == "restorable", markers(sessions, cp)
        with sessions() as s:
            rows = s.execute(
                select(Stripe.id, Shard.id.label("shard"), Shard.path, Stripe.stripe_index)
                .add_columns(Stripe.node_id)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == cp)
            ).all()
        assert len(rows) == len(shards) * WIDTH
        target = shards[0]
        of_target = sorted((r for r in rows if r.path == target.path), key=lambda r: r.stripe_index)

        def held(i: int) -> Path:
            return coded.root_for(of_target[i].node_id) / job / "1" / target.path

        counted = _scrubbed()
        # Every stripe read on its holder, one unit per serving node, nothing found.
        clean = await run_scrub(client, f"scrub-test/{job}/clean")
        assert (clean.stripes, clean.corrupt, clean.lost) == (len(rows), 0, 0), clean
        assert clean.units == len(NODES) and clean.replicas == 0, clean
        # The workers' metrics count what each read found.
        assert _scrubbed() - counted == {"good": len(rows), "corrupt": 0, "lost": 0}

        # A byte flipped at rest in one stripe: found and moved `found bad`, the set still
        # decodes; the rebuild the scrub asked for cuts it again on its holder.
        _flip(held(0))
        one = await run_scrub(client, f"scrub-test/{job}/one")
        assert (one.stripes, one.corrupt, one.lost) == (len(rows) - 1, 1, 0), one
        found = [d for _, t, d in events(engine, cp, "corrupt") if t == "coded"]
        assert [d["stripes"] for d in found] == [1], found
        assert markers(sessions, cp)["coded"][0] == "restorable"
        await rebuilt(client, job)
        _whole_again(sessions, cfg, cp, job, target.path)

        assert (_scrubbed() - counted)["corrupt"] == 1
        # The same stripe is not found bad twice: cut again, it reads back good.
        again = await run_scrub(client, f"scrub-test/{job}/again")
        assert (again.corrupt, again.lost) == (0, 0), again

        # An operator's read-back of the whole coded copy reads every verified stripe on its
        # holder: a rotten stripe of the other set found as the scrub finds one.
        other = shards[1]
        of_other = {r.stripe_index: r for r in rows if r.path == other.path}
        _flip(coded.root_for(of_other[2].node_id) / job / "1" / other.path)
        async for api in running_client(create_app(cfg)):
            outcome = await verify_coded(api, job)
        assert (outcome["read"], outcome["good"], outcome["corrupt"]) == (
            len(rows),
            len(rows) - 1,
            1,
        ), outcome
        assert markers(sessions, cp)["coded"][0] == "restorable"
        await rebuilt(client, job)
        _whole_again(sessions, cfg, cp, job, other.path)

        # Two stripes of the set gone: below k, the coded copy fails, the next tier serves.
        held(0).unlink()
        held(1).unlink()
        two = await run_scrub(client, f"scrub-test/{job}/two")
        assert (two.corrupt, two.lost) == (0, 2), two
        state, reason = markers(sessions, cp)["coded"]
        assert state == "failed" and "stripe" in (reason or ""), (state, reason)
        # A rebuild the first of them asked for (if it was found first) has nothing to cut from.
        await rebuilt(client, job)
        with sessions() as s:
            plan = latest_restorable(s, job, cfg.tiers).plan
        assert next(e for e in plan if e.path == target.path).tier == "lustre"

    async for api in running_client(create_app(cfg)):
        r = await api.get("/v1/scrub")
        assert r.status_code == 200, r.text
        view = {t["tier"]: t for t in r.json()["tiers"]}["coded"]
        good = clean.stripes + one.stripes + again.stripes + outcome["good"] + two.stripes
        assert (view["stripes"], view["replicas"]) == (good, 0), view
        assert (view["corrupt"], view["lost"]) == (2, 2), view
