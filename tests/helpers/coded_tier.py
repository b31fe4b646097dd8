"""A coded peer tier on real catalogs and real files, for its activity tests and its end-to-end
tests.

For the activity tests: rs(2,1), node-a's files, four nodes, on the module's catalog: settings,
a sealed checkpoint, its encode on node-a, and where node-a stages a stripe. The fixtures `coded`
(the settings, with the data endpoints' credential `SECRET`) and `server` (node-a's data
endpoint, over real HTTP) serve the tests that read stripes over the network: a test module
imports them by name, and pytest sees them as its own.

For the end-to-end tests (the lifecycle, the rebuild, the scrub, a killed holder): the settings
of any code over any nodes (`coded_settings`), the node workers reported in before the shared
worker starts (`coded_stack`), a node declared lost as the API declares it (`declare_lost`), the
stripe rows as the catalog has them (`stripe_rows`), and a restore on a spare (`spare_plan`,
`restore_on_spare`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from tierpoint_client.erasure import Code
from tierpoint_client.models import PlanEntry
from tierpoint_client.peer import PEERS
from tierpoint_client.restore import restore_plan

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.placement import stripe_holders
from activities.pull import PullActivities
from activities.stores import Stores
from api.schemas.checkpoints import RestorePlanEntryOut
from tests.helpers.faults import OVERALL_TIMEOUT, db_now, workers_reported_in
from tests.helpers.lifecycle import (
    ShardSpec,
    new_job,
    random_shards,
    running_workers,
    seed_checkpoint,
)
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.models import Node, Shard, Stripe
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.tier_copy.node_lost import NodeLost
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, BatchResult, PlanInput, SealInput
from tierpoint.contract.peer import rereplicate_id
from tierpoint.contract.stripes import EncodeInput, PullInput
from tierpoint.services import node_lost
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
NODES = ["node-a", "node-b", "node-c", "node-d"]
STEP = 5
SECRET = "tp_worker-credential-of-this-test"


def coded_settings(
    settings: Settings,
    tmp_path: Path,
    *,
    code: Code = CODE,
    nodes: Sequence[str] = NODES,
    below: Sequence[str] | None = None,
    tier: Mapping[str, object] | None = None,
    **extra: object,
) -> Settings:
    """ssd -> coded (`code`, each node's root under `tmp_path`/nodes) -> the tiers of `settings`
    after ssd, or only those `below` names; every node's local root made. `tier`: more fields of
    the coded tier (its scrub bandwidth); `extra`: more settings (the data endpoints'
    credential)."""
    ssd, *rest = settings.tiers
    coded = TierConfig.model_validate(
        {
            "name": "coded",
            "kind": TierKind.PEER,
            "root": str(tmp_path / "nodes/{node}/coded"),
            "code": str(code),
            **(tier or {}),
        }
    )
    for node in nodes:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    kept = rest if below is None else [t for t in rest if t.name in below]
    return Settings.model_validate({**settings.model_dump(), "tiers": [ssd, coded, *kept], **extra})


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


@contextlib.asynccontextmanager
async def coded_stack(
    settings: Settings, client: Client, engine: Engine, nodes: Sequence[str]
) -> AsyncIterator[None]:
    """The workers of `nodes` (their data endpoints with them), reported in, then the project's
    shared worker: the lifecycle's plan places stripes on the nodes serving when it runs, and the
    shared worker refuses a code that the nodes it knows cannot hold. All serve until the end."""
    since = db_now(engine)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running_workers(settings, client, nodes, shared=False))
        await workers_reported_in(engine, tuple(nodes), since)
        await stack.enter_async_context(running_workers(settings, client, (), shared=True))
        yield


async def declare_lost(settings: Settings, node: str, client: Client | None = None) -> NodeLost:
    """`node` declared lost as the API's declaration does: the catalog's move committed, then,
    given a Temporal client, the re-replications and rebuilds started or signalled."""
    engine = make_async_engine(settings.database_url, pool_size=1)
    try:
        async with async_sessions(engine).begin() as s:
            lost = await node_lost.declare(s, settings, node, "test")
    finally:
        await engine.dispose()
    await node_lost.rereplicate(client, lost)
    return lost


class StripeRow(NamedTuple):
    path: str
    shard_node: str
    stripe_index: int
    holder: str
    state: str
    holder_lost: bool
    size: int
    crc32c: str


def stripe_rows(sessions: sessionmaker[Session], checkpoint_id: int) -> list[StripeRow]:
    """Every stripe of the checkpoint's coded copies, as the catalog has it."""
    with sessions() as s:
        rows = s.execute(
            select(
                Shard.path,
                Shard.node_id,
                Stripe.stripe_index,
                Stripe.node_id,
                Stripe.state,
                Node.lost_at,
                Stripe.size,
                Stripe.crc32c,
            )
            .join(Shard, Shard.id == Stripe.shard_id)
            .join(Node, Node.id == Stripe.node_id)
            .where(Stripe.checkpoint_id == checkpoint_id)
        ).all()
    return [StripeRow(*r[:5], r[5] is not None, *r[6:]) for r in rows]


def spare_plan(settings: Settings, sessions: sessionmaker[Session], job: str) -> list[PlanEntry]:
    """The restore plan of the job's latest checkpoint for a reader on no node of the job (a
    spare), as the API sends it and the client reads it."""
    with sessions() as s:
        latest = latest_restorable(s, job, settings.tiers)
    return [
        PlanEntry.from_json(RestorePlanEntryOut.model_validate(e).model_dump(mode="json"))
        for e in latest.plan
    ]


def restore_on_spare(plan: list[PlanEntry], dest: Path, token: str = SECRET) -> dict[str, bytes]:
    """The client's restore of `plan` into `dest`: the files it put there, by path."""
    restore_plan(plan, dest, {}, token=token)
    return {e.path: (dest / e.path).read_bytes() for e in plan}


async def rebuilt(client: Client, job: str, step: int = 1) -> None:
    """The checkpoint's rebuild (its latest run), asked for by whoever found a stripe bad, ended."""
    handle = client.get_workflow_handle(rereplicate_id(job, step))
    await asyncio.wait_for(handle.result(), OVERALL_TIMEOUT)


async def verify_coded(api: httpx.AsyncClient, job: str) -> dict[str, Any]:
    """An operator's `POST .../verify` of step 1's coded copy, once its run completed (asking
    again joins it)."""
    async with asyncio.timeout(OVERALL_TIMEOUT):
        while True:
            r = await api.post(f"/v1/jobs/{job}/checkpoints/1/verify", json={"tier": "coded"})
            assert r.status_code == 202, r.text
            body = r.json()
            if body["status"] != "running":
                assert body["status"] == "completed", body
                outcome: dict[str, Any] = body["outcome"]
                return outcome
