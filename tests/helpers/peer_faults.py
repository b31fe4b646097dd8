"""What the peer tier's fault tests share: settings with a peer tier, checkpoints written and
registered as a training job does, the catalog's view of the peer copies and of the nodes'
endpoints (the pending copy batch is tests/helpers/pending.py's)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from tierpoint_client import Client as TierpointClient
from tierpoint_client import build_manifest

from tests.helpers.client import write_shards
from tests.helpers.lifecycle import RESULT_TIMEOUT
from tests.helpers.pki import Pki
from tierpoint.catalog.models import Checkpoint, Event, Job, Node, Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleResult, workflow_id
from tierpoint.tier_config import TierConfig, TierKind

WORKER_SECRET = "tp_worker-credential-of-the-peer-fault-tests"
POLL = 0.2


def peer_settings(
    settings: Settings,
    tmp_path: Path,
    nodes: list[str],
    *,
    later: bool = False,
    below: Sequence[str] = (),
    copies: int = 1,
    **extra: Any,
) -> Settings:
    """ssd -> peer (-> lustre -> s3 with `later`, or the tiers `below` names), a worker
    credential, the nodes' roots; with `copies` K, the peer tier is K catalog tiers `peer`,
    `peer.2` ... `peer.K`."""
    ssd, *rest = settings.tiers
    peer = TierConfig(
        name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"), copies=copies
    )
    for node in nodes:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nodes" / node / "peer").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {
            **settings.model_dump(),
            "tiers": [ssd, peer, *(t for t in rest if later or t.name in below)],
            "data_token": WORKER_SECRET,
            **extra,
        }
    )


def tls_peer_settings(
    settings: Settings, tmp_path: Path, nodes: list[str], pki: Pki, *, client_auth: bool = False
) -> Settings:
    """`peer_settings` with the data endpoint over TLS with the test CA's server pair; with
    `client_auth`, mutual TLS, the workers presenting the CA's client certificate."""
    tls: dict[str, Any] = {
        "data_tls_cert": pki.server_cert,
        "data_tls_key": pki.server_key,
        "data_tls_ca": pki.ca,
    }
    if client_auth:
        tls |= {
            "data_tls_client_auth": True,
            "data_tls_client_cert": pki.client_cert,
            "data_tls_client_key": pki.client_key,
        }
    return peer_settings(settings, tmp_path, nodes, **tls)


@dataclass(frozen=True)
class PeerCopy:
    node: str | None
    state: str
    bytes_done: int
    error: str | None


def peer_copies(
    sessions: sessionmaker[Session], checkpoint_id: int, tier: str = "peer"
) -> dict[str, PeerCopy]:
    """path -> its replica on peer tier `tier` (holder, state, bytes done, last error)."""
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Replica.node_id, Replica.state, Replica.bytes_done, Replica.error)
            .join(Shard, Shard.id == Replica.shard_id)
            .where(Replica.checkpoint_id == checkpoint_id, Replica.tier == tier)
        )
        return {p: PeerCopy(n, str(st), int(b or 0), e) for p, n, st, b, e in rows}


def replica_states(sessions: sessionmaker[Session], checkpoint_id: int, tier: str) -> list[str]:
    with sessions() as s:
        return [
            str(st)
            for (st,) in s.execute(
                select(Replica.state).where(
                    Replica.checkpoint_id == checkpoint_id, Replica.tier == tier
                )
            )
        ]


def copied_events(
    sessions: sessionmaker[Session], checkpoint_id: int, tier: str
) -> list[dict[str, Any]]:
    with sessions() as s:
        return [
            dict(d or {})
            for (d,) in s.execute(
                select(Event.detail)
                .where(
                    Event.checkpoint_id == checkpoint_id,
                    Event.kind == "copied",
                    Event.tier == tier,
                )
                .order_by(Event.id)
            )
        ]


def checkpoint_id(sessions: sessionmaker[Session], job: str, step: int) -> int:
    with sessions() as s:
        found = s.scalar(
            select(Checkpoint.id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
    assert found is not None, f"{job} step {step} is not registered"
    return found


def data_url(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.data_url).where(Node.id == node))


async def wait_for_endpoints(
    sessions: sessionmaker[Session], nodes: list[str], within: float, not_: str | None = None
) -> dict[str, str]:
    """The nodes' data endpoints once every one has reported one (other than `not_`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        urls = {n: data_url(sessions, n) for n in nodes}
        if all(u is not None and u != not_ for u in urls.values()):
            return {n: str(u) for n, u in urls.items()}
        assert loop.time() < deadline, f"no data endpoint reported: {urls}"
        await asyncio.sleep(POLL)


async def write_and_register(
    trainer: TierpointClient,
    temporal: Client,
    cfg: Settings,
    job: str,
    step: int,
    nodes: Sequence[str],
    *,
    per_node: int = 2,
    size: int = 32 * 1024 + 3,
) -> LifecycleResult:
    """What a training job does: each node's shards written on its local tier, the checkpoint
    registered through the API (which starts its lifecycle), and the lifecycle's outcome."""
    local = cfg.local_tier()
    assert local is not None
    manifest = []
    for node in nodes:
        directory = local.root_for(node) / job / str(step)
        write_shards(directory, {f"rank-{node}/shard-{i}.bin": size for i in range(per_node)})
        manifest += build_manifest(directory, node)
    await asyncio.to_thread(trainer.register_manifest, job, step, manifest)
    handle = temporal.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
    async with asyncio.timeout(RESULT_TIMEOUT):
        while True:
            # Started by the API after its commit: wait until Temporal knows it.
            try:
                await handle.describe()
                break
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
                await asyncio.sleep(POLL)
        result = await handle.result()
    assert isinstance(result, LifecycleResult)
    return result
