"""Copies a node's data endpoint finds damaged while it serves them.

The endpoint serves a file the catalog lists as a verified copy on its node, and knows its
registered size. A file that is not that size when it is opened (fstat), that ends before it while
it is sent, or that is gone, does not hold the registered bytes. That is the endpoint's own finding,
not a reader's claim (a reader's report is read back before it counts: `corrupt_reports.py`), so it
is recorded at once, as a scrub records what it reads (`tierpoint/catalog/tier_copy/damage.py`): the
replica `corrupt` (gone: `lost`) and its tier copy out of `restorable` in one transaction, committed
before the reader gets its error; then the checkpoint's repair is asked for, which copies it again
from a tier that holds it verified.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass

from temporalio.client import Client

from tierpoint import logs, metrics_worker
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.replica import placement
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef
from tierpoint.temporal import request_repair

log = logs.get(__name__)


class RepairRequests:
    """Asks for checkpoints' repairs from the endpoint's threads, on the worker's event loop
    (whose Temporal client they share)."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def ask(self, checkpoint_id: int, job: str, step: int, reason: str, branch: int = 1) -> None:
        try:
            done = asyncio.run_coroutine_threadsafe(
                request_repair(self._client, checkpoint_id, job, step, reason, branch), self._loop
            )
        except RuntimeError:  # the worker is stopping: its loop is closed
            log.warning("repair not requested: the worker is stopping", job=job, step=step)
            return

        def said(f: Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                # The copy stays marked and demoted: nobody is sent to it; a scrub, a
                # reconciliation or an operator's repair makes it again.
                log.warning("repair request failed", job=job, step=step, error=repr(f.exception()))

        done.add_done_callback(said)


@dataclass(frozen=True)
class DamagedCopies:
    """Records the damaged copies `node`'s endpoint finds."""

    sessions: Sessions
    node: str
    repairs: RepairRequests | None

    def record(self, tier: str, ref: ShardRef, state: ReplicaState, reason: str) -> bool:
        """Mark the node's verified copy of `ref` on `tier` `state` (corrupt or lost), demote
        its tier, and ask for the checkpoint's repair. Whether this call marked it (False: the
        catalog lists no verified copy here any more, e.g. it is being expired)."""
        actor = f"data endpoint of {self.node}"
        with self.sessions.begin() as s:
            found = placement.served_replica(
                s, self.node, tier, ref.job, ref.step, ref.path, ref.branch
            )
            if found is None:
                return False
            replica_id, checkpoint_id = found
            damage = mark_damaged(s, {replica_id: f"{actor}: {reason}"}, state, actor)
        if not damage.marked:
            return False
        metrics_worker.DATA_COPIES_DAMAGED.labels(tier).inc()
        log.warning(
            "data endpoint found a damaged copy",
            tier=tier,
            job=ref.job,
            step=ref.step,
            path=ref.path,
            why=reason,
        )
        if self.repairs is not None:
            self.repairs.ask(checkpoint_id, ref.job, ref.step, f"{actor}: {reason}", ref.branch)
        return True
