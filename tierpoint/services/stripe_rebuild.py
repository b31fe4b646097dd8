"""Asking for a coded copy's rebuild once a stripe of it is found bad, without waiting for a node
loss: the scrub on a holder, a reader's report confirmed there and reconciliation move the stripe
`found bad` (`tier_copy/stripe_damage.py`) and commit; then the checkpoint's rebuild is asked for
(`temporal.start_peer_replan`: `PeerRereplicate` started, or the run under way told to plan
again). Its plan cuts every corrupt or lost stripe of a set that keeps k again, on a node holding
no other stripe of the set (`activities/peer_coded.py`), as after a lost node: one home.

Whoever asks reads what is due from the catalog (`rebuilding.due`), not from what it found in
this attempt: an attempt retried after its commit (the ask failed) finds the stripes already
marked and asks again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from tierpoint import logs
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.reads.checkpoint_views import checkpoint_refs
from tierpoint.catalog.reads.views import CheckpointRefView
from tierpoint.catalog.stripe import rebuilding
from tierpoint.contract.peer import RereplicateInput
from tierpoint.temporal import start_peer_replan

log = logs.get(__name__)

# How long an activity's thread waits for one ask on the worker's event loop: a start or a signal,
# well under any activity's timeout. Past it the attempt fails and its retry asks again.
ASK_TIMEOUT = 30.0


def due(sessions: Sessions, tier: str, checkpoint_ids: Iterable[int]) -> list[CheckpointRefView]:
    """The checkpoints of `checkpoint_ids` whose coded copy on `tier` has stripes to cut again."""
    with sessions.begin() as s:
        ids = rebuilding.due(s, tier, checkpoint_ids)
        refs = checkpoint_refs(s, ids)
    return [refs[i] for i in ids if i in refs]


async def ask(client: Client, refs: Iterable[CheckpointRefView]) -> None:
    for ref in refs:
        inp = RereplicateInput(checkpoint_id=ref.id, job=ref.job, step=ref.step)
        await start_peer_replan(client, inp, ref.branch)
        log.info("stripe rebuild asked for", job=ref.job, step=ref.step, branch=ref.branch)


class RebuildRequests:
    """Asks from an activity's thread, on the worker's event loop (whose Temporal client it
    shares), and waits for the answer: a failed ask fails the attempt, which is retried."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def ask(self, refs: Iterable[CheckpointRefView]) -> None:
        wanted = list(refs)
        if wanted:
            asyncio.run_coroutine_threadsafe(ask(self._client, wanted), self._loop).result(
                ASK_TIMEOUT
            )


def ask_due(
    sessions: Sessions,
    requests: RebuildRequests | None,
    tier: str,
    checkpoint_ids: Iterable[int],
) -> None:
    """Ask for the rebuild of those of the checkpoints whose coded copy on `tier` has stripes
    found bad, from an activity's thread, after the commit that marked them."""
    refs = due(sessions, tier, checkpoint_ids)
    if not refs:
        return
    if requests is None:
        # Never dropped quietly: the stripes would stay bad until a node is lost.
        raise ApplicationError("this worker cannot ask for a rebuild", non_retryable=True)
    requests.ask(refs)
