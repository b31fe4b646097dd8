"""Starting a registered checkpoint's lifecycle, and recording that it has one.

The catalog commit of a registration is the job's durable acknowledgement; the workflow start
follows from the catalog, right after the commit (the API) and later for any registered checkpoint
still without one (the reconciler in the shared worker). Both go through `start_and_record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client

from tierpoint.catalog.checkpoint import registration
from tierpoint.catalog.engine import Transact
from tierpoint.contract.lifecycle import LifecycleInput
from tierpoint.temporal import start_lifecycle


@dataclass(frozen=True)
class StartOutcome:
    created: bool  # this call created the workflow (False: it existed already)
    recorded: bool  # this call set the checkpoint's workflow_started_at


async def start_and_record(client: Client, transact: Transact, ref: LifecycleInput) -> StartOutcome:
    """Idempotent: the workflow id is the checkpoint's natural id and the catalog flag is set
    with a conditional update, so any number of racing starters leave exactly one lifecycle.
    `transact` is the caller's door to the catalog (the API's async engine, a worker's sync one)."""
    created = await start_lifecycle(client, ref)
    recorded = await transact(lambda s: registration.mark_workflow_started(s, ref.checkpoint_id))
    return StartOutcome(created, recorded)


async def start_unstarted(
    client: Client,
    transact: Transact,
    *,
    older_than: timedelta,
    limit: int,
) -> list[LifecycleInput]:
    """Start the lifecycle of registered checkpoints that have none, oldest first (at most
    `limit`; registered more than `older_than` ago, so the API's own start goes first). Returns
    the ones this call recorded as started."""
    todo = await transact(lambda s: registration.unstarted_checkpoints(s, older_than, limit))
    started = []
    for ref in todo:
        if (await start_and_record(client, transact, ref)).recorded:
            started.append(ref)
    return started
