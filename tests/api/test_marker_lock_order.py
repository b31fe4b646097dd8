"""API actions that lock a checkpoint and then one of its tier markers, against the store's
writers that lock a marker and then record an event (promotion, damage, a lost node): the event's
foreign key takes KEY SHARE on the checkpoint row. An action that held the row FOR UPDATE while it
waited for the marker closed a cycle with such a writer: Postgres ended one of them as deadlocked,
and when that was the API's transaction the operator got 503 `catalog_unavailable` for a plain
quarantine (seen once in three runs of the stateful test). The actions now lock the row FOR NO KEY
UPDATE, which orders them with each other and with the retention executor (FOR UPDATE) but not
with foreign-key checks, so the writer goes on and the action waits for it, then answers.

And what the stateful test's flake was first taken for: nothing the API does waits on a delete's
lock (`expiry_repo.hold_for_delete`), which only deletes and the finish of an expiry take.

By construction, not timing: the writer's transaction holds the marker (its first statement) when
the request is sent, and goes on only once the request waits for a lock in Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.api import seed, set_marker, set_replicas
from tests.helpers.expiry_races import lock_waiters
from tierpoint.catalog.tier_copy.expiry import hold_for_delete
from tierpoint.catalog.tier_copy.promotion import PromoteOutcome, promote

WAIT_LIMIT = 60.0  # seconds: only a bound on a hang, never a timing assertion
STEP = 7


def _checkpoint_id(catalog: Engine, job: str, step: int) -> int:
    with catalog.connect() as conn:
        cid: int = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": step},
        ).scalar_one()
    return cid


async def _until_waiting(catalog: Engine, request: asyncio.Future[httpx.Response]) -> None:
    """Until some backend waits for a lock (the API's); fails if the request answered first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT
    while loop.time() < deadline:
        if request.done():
            raise AssertionError(f"answered without waiting for the marker: {request.result()}")
        if await asyncio.to_thread(lock_waiters, catalog):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the request neither waited for the marker nor answered")


def _hold_marker(s: Session, cid: int, tier: str) -> None:
    # What `promote` (and `damage.mark_damaged`) do first: the marker, and only the marker.
    s.execute(
        text("SELECT state FROM checkpoint_tier WHERE checkpoint_id = :c AND tier = :t FOR UPDATE"),
        {"c": cid, "t": tier},
    ).one()


Action = Callable[[httpx.AsyncClient, str], Awaitable[httpx.Response]]


async def _quarantine(client: httpx.AsyncClient, job: str) -> httpx.Response:
    body = {"reason": "diverged after loading", "tier": "lustre"}
    return await client.post(f"/v1/jobs/{job}/checkpoints/{STEP}/quarantine", json=body)


async def _lift(client: httpx.AsyncClient, job: str) -> httpx.Response:
    path = f"/v1/jobs/{job}/checkpoints/{STEP}/quarantine"
    return await client.delete(path, params={"tier": "lustre"})


async def _retry(client: httpx.AsyncClient, job: str) -> httpx.Response:
    return await client.post(f"/v1/jobs/{job}/checkpoints/{STEP}/retry")


async def _delete(client: httpx.AsyncClient, job: str) -> httpx.Response:
    return await client.delete(f"/v1/jobs/{job}/checkpoints/{STEP}", params={"force": "true"})


ACTIONS: dict[str, tuple[Action, int]] = {
    "delete": (_delete, 202),
    "quarantine a tier's copy": (_quarantine, 200),
    "lift a tier's quarantine": (_lift, 200),
    # The promotion below makes lustre restorable: nothing is left to retry.
    "retry": (_retry, 409),
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_an_action_on_a_copy_being_promoted_waits_for_the_promotion_and_answers(
    client: httpx.AsyncClient, catalog: Engine, job: str, action: str
) -> None:
    """The lustre copy's promotion holds its marker when the request comes; it then records its
    event (KEY SHARE on the checkpoint row) and commits; the request answers as it would have
    after the promotion, never 503."""
    call, status = ACTIONS[action]
    await seed(client, catalog, job, [STEP], tiers=("ssd",))
    set_replicas(catalog, job, STEP, "lustre", "verified")
    set_marker(catalog, job, STEP, "lustre", "failed")
    cid = _checkpoint_id(catalog, job, STEP)
    outcome: PromoteOutcome | None = None
    with Session(catalog) as promoting:
        _hold_marker(promoting, cid, "lustre")
        request = asyncio.ensure_future(call(client, job))
        await _until_waiting(catalog, request)
        # In a thread: before the fix it waited for the request's row lock, which Postgres ended
        # as a deadlock (one side or the other, whichever checked first).
        outcome = await asyncio.to_thread(promote, promoting, cid, "lustre", ["s3"], None)
        promoting.commit()
    r = await asyncio.wait_for(request, WAIT_LIMIT)
    assert outcome is not None and outcome.state == "restorable", outcome
    assert r.status_code == status, r.text


async def _pin(client: httpx.AsyncClient, job: str) -> httpx.Response:
    return await client.put(f"/v1/jobs/{job}/checkpoints/{STEP}/pin")


async def _lease(client: httpx.AsyncClient, job: str) -> httpx.Response:
    body = {"ttl_seconds": 60, "holder": "restore"}
    return await client.post(f"/v1/jobs/{job}/checkpoints/{STEP}/leases", json=body)


UNDER_DELETE: dict[str, tuple[Action, int]] = {
    "quarantine a tier's copy": (_quarantine, 200),
    "pin": (_pin, 200),
    "lease": (_lease, 201),
}


@pytest.mark.parametrize("action", sorted(UNDER_DELETE))
async def test_nothing_the_api_does_waits_on_a_delete_in_progress(
    client: httpx.AsyncClient, catalog: Engine, job: str, action: str
) -> None:
    """A delete of the s3 copy holds the copy's delete lock for as long as its bytes go; the
    request answers meanwhile (a lock wait would show in Postgres: it must not happen)."""
    call, status = UNDER_DELETE[action]
    await seed(client, catalog, job, [STEP], tiers=("ssd", "lustre", "s3"))
    cid = _checkpoint_id(catalog, job, STEP)
    with Session(catalog) as deleting:
        assert hold_for_delete(deleting, cid, "s3") == "restorable"
        r = await asyncio.wait_for(call(client, job), WAIT_LIMIT)
        assert lock_waiters(catalog) == 0
        deleting.rollback()
    assert r.status_code == status, r.text
