"""A coded peer tier (rs(2,1), node-a's files, four nodes) on the module's catalog and real
files: settings, a sealed checkpoint, its encode on node-a, and where node-a stages a stripe.

The fixtures `coded` (the settings, with the data endpoints' credential `SECRET`) and `server`
(node-a's data endpoint, over real HTTP) serve the tests that read stripes over the network: a
test module imports them by name, and pytest sees them as its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment
from tierpoint_client.erasure import Code
from tierpoint_client.peer import PEERS

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.placement import stripe_holders
from activities.pull import PullActivities
from activities.stores import Stores
from tests.helpers.lifecycle import ShardSpec, new_job, random_shards, seed_checkpoint
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, BatchResult, PlanInput, SealInput
from tierpoint.contract.stripes import EncodeInput, PullInput
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
NODES = ["node-a", "node-b", "node-c", "node-d"]
STEP = 5
SECRET = "tp_worker-credential-of-this-test"


def coded_settings(settings: Settings, tmp_path: Path, **extra: object) -> Settings:
    """ssd -> coded (rs(2,1)) -> the rest of `settings`' tiers."""
    ssd, *rest = settings.tiers
    tier = TierConfig(
        name="coded", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/coded"), code=str(CODE)
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate({**settings.model_dump(), "tiers": [ssd, tier, *rest], **extra})


def sealed(
    settings: Settings, sessions: sessionmaker[Session], size: int
) -> tuple[int, str, list[ShardSpec]]:
    """Three files of node-a registered and sealed on ssd, the four nodes reported in."""
    shards = random_shards(["node-a"], 3, size)
    seeded = seed_checkpoint(settings, sessions, new_job(), STEP, shards)
    with sessions.begin() as s:
        for node in NODES:
            upsert_node(s, node, {})
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=seeded.checkpoint_id)).batches
    seal = SealInput(
        checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=STEP, batch=batch, tier="ssd"
    )
    assert env.run(acts.seal_batch, seal).verified == 3
    return seeded.checkpoint_id, seeded.job, shards


def encode(settings: Settings, sessions: sessionmaker[Session], cp: int, job: str) -> BatchResult:
    """The encode of node-a's batch, run on node-a's worker."""
    acts = EncodeActivities(sessions, settings, Stores(settings), node="node-a")
    inp = EncodeInput(
        checkpoint_id=cp,
        job=job,
        step=STEP,
        batch=Batch(node="node-a", first=0, last=2),
        source="ssd",
        tier="coded",
    )
    return ActivityEnvironment().run(acts.encode_batch, inp)


def staged_file(settings: Settings, job: str, index: int, path: str) -> Path:
    root = settings.tier("coded").root_for("node-a")
    return root / STAGING_DIR / str(index) / job / str(STEP) / path


def holders_a() -> list[str]:
    """The holders of node-a's stripe set, stripe i on the i-th."""
    holders = stripe_holders("node-a", NODES, CODE)
    assert holders is not None
    return holders


def pull(
    settings: Settings, sessions: sessionmaker[Session], cp: int, job: str, holder: str
) -> BatchResult:
    """The pull of node-a's batch, run on `holder`'s worker."""
    acts = PullActivities(sessions, settings, Stores(settings), node=holder)
    batch = Batch(node="node-a", first=0, last=2, holder=holder)
    inp = PullInput(checkpoint_id=cp, job=job, step=STEP, batch=batch, tier="coded")
    return ActivityEnvironment().run(acts.pull_batch, inp)


def stripe_states(sessions: sessionmaker[Session], cp: int) -> dict[tuple[str, int], str]:
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Stripe.stripe_index, Stripe.state)
            .join(Shard, Shard.id == Stripe.shard_id)
            .where(Stripe.checkpoint_id == cp)
        )
        return {(p, i): st for p, i, st in rows}


def ready(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer, size: int
) -> tuple[int, str, list[ShardSpec]]:
    """Sealed, encoded on node-a, whose data endpoint `server` is."""
    cp, job, shards = sealed(coded, sessions, size)
    with sessions.begin() as s:
        upsert_node(s, "node-a", {}, data_url=server.url)
    assert encode(coded, sessions, cp, job).verified == 3
    return cp, job, shards


@pytest.fixture
def coded(catalog_settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(catalog_settings, tmp_path, data_token=SECRET)


@pytest.fixture
def server(coded: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(coded, sessions, "node-a", 0)
    yield srv
    srv.shutdown()
    srv.server_close()
    PEERS.close()
