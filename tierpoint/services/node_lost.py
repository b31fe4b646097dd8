"""Declaring a node lost: the catalog change (one transaction, committed by the caller), then
telling every lifecycle still in flight on the node, so that none keeps waiting on a task queue
no worker will serve again.

Telling is best effort and repeatable: the declaration is idempotent, so an operator whose call
found Temporal unreachable repeats it. A lifecycle not started yet needs no signal: its plan reads
the node as lost (under a lock that orders it with the declaration)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio.client import Client

from tierpoint import logs
from tierpoint.catalog.engine import AsyncSession
from tierpoint.catalog.tier_copy import node_lost
from tierpoint.config import Settings
from tierpoint.contract.peer import RereplicateInput
from tierpoint.temporal import signal_node_lost, start_peer_rereplication
from tierpoint.tier_config import TierKind

log = logs.get(__name__)

SIGNAL_TIMEOUT = 5.0


@dataclass(frozen=True)
class Told:
    signalled: int  # running lifecycles that were told
    not_running: int  # in flight in the catalog, no running workflow (not started or finished)
    unreachable: int  # could not be told: Temporal unreachable or failing


async def declare(
    session: AsyncSession, settings: Settings, node: str, actor: str
) -> node_lost.NodeLost:
    local = [t.name for t in settings.tiers if t.kind is TierKind.LOCAL]
    peer = [t.name for t in settings.peer_tiers()]
    codes = {t.name: t.stripe_code for t in settings.peer_tiers() if t.stripe_code is not None}
    return await session.run_sync(node_lost.mark_lost, node, local, actor, peer, codes)


async def tell_lifecycles(client: Client | None, lost: node_lost.NodeLost) -> Told:
    in_flight = [c for c in lost.checkpoints if c.in_flight]
    if client is None:
        return Told(0, 0, len(in_flight))

    async def tell(cp: node_lost.AffectedCheckpoint) -> bool | None:
        try:
            return await asyncio.wait_for(
                signal_node_lost(client, cp.job, cp.step, lost.node, cp.branch), SIGNAL_TIMEOUT
            )
        except Exception as exc:
            log.warning(
                "lifecycle not told of a lost node",
                job=cp.job,
                step=cp.step,
                node=lost.node,
                error=repr(exc),
            )
            return None

    results = await asyncio.gather(*(tell(c) for c in in_flight))
    return Told(
        signalled=sum(1 for r in results if r is True),
        not_running=sum(1 for r in results if r is False),
        unreachable=sum(1 for r in results if r is None),
    )


async def rereplicate(client: Client | None, lost: node_lost.NodeLost) -> int:
    """Start copying again, to new holders, the peer copies the node held; how many checkpoints'
    runs were started (the others are logged: declaring the node lost again retries them)."""
    if client is None:
        return 0

    async def start(cp: tuple[int, str, int, int]) -> bool:
        cid, job, step, branch = cp
        try:
            await asyncio.wait_for(
                start_peer_rereplication(
                    client,
                    RereplicateInput(checkpoint_id=cid, job=job, step=step),
                    lost.node,
                    branch,
                ),
                SIGNAL_TIMEOUT,
            )
        except Exception as exc:
            log.warning("peer copies not re-replicated", job=job, step=step, error=repr(exc))
            return False
        return True

    return sum(await asyncio.gather(*(start(c) for c in lost.peer_copies_lost)))
