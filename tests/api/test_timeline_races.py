"""A rollback against a retention expiry and a lease, ordered by the catalog's own row locks
rather than by timing (as tests/api/test_expiry_races.py does for pins and leases): the real
`begin_expiry` holds a checkpoint's row while the rollback request waits for it. Nothing is
lost: the rollback judges its target after the expiry committed, the new timeline's checkpoints
are then kept by retention, the superseded ones go first, and a lease on a superseded checkpoint
keeps holding it."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.api import seed, set_marker
from tests.helpers.expiry_races import (
    NEWEST_ON_FAST_TIERS,
    WAIT_LIMIT,
    begin_judged,
    during_begin,
    until_waiting,
)
from tests.helpers.retention import create_job
from tierpoint.catalog.locks import lock_in_order
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.contract.retention import BeginState


def _ids(catalog: Engine, job: str) -> dict[int, int]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.step, c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.branch = 1"
            ),
            {"job": job},
        )
        return {step: cid for step, cid in rows}


async def test_a_rollback_waits_for_an_expiry_of_its_target_and_then_keeps_the_timeline(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2, 3])
    create_job(sessionmaker(catalog), job, NEWEST_ON_FAST_TIERS)
    ids = _ids(catalog, job)

    # Retention expires step 2 from lustre (step 3 is newer) while the job rolls back to it.
    rollback = client.post(f"/v1/jobs/{job}/rollback", json={"step": 2, "from_branch": 1})
    r = await during_begin(catalog, job, ids[2], "lustre", rollback)
    # Its lustre copy is going, its ssd and s3 copies are not: the rollback stands on them.
    assert r.status_code == 201, r.text
    latest = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": "node-a"})
    assert latest.json()["step"] == 2
    assert {e["tier"] for e in latest.json()["plan"]} == {"ssd"}

    # On the new timeline step 2 is the newest: retention keeps its local copy; the superseded
    # step 3 is the one that goes.
    kept = begin_judged(catalog, job, ids[2], "ssd")
    assert kept.state is BeginState.SKIPPED, kept
    gone = begin_judged(catalog, job, ids[3], "ssd")
    assert gone.state is BeginState.EXPIRING, gone


async def test_a_lease_on_a_superseded_checkpoint_keeps_holding_it(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2])
    create_job(sessionmaker(catalog), job, NEWEST_ON_FAST_TIERS)
    ids = _ids(catalog, job)
    lease = await client.post(f"/v1/jobs/{job}/checkpoints/2/leases", json={"ttl_seconds": 600})
    assert lease.status_code == 201, lease.text
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 1})
    assert r.status_code == 201 and r.json()["superseded"] == [2], r.text

    held = begin_judged(catalog, job, ids[2], "ssd")
    assert held.state is BeginState.SKIPPED and "leased" in (held.reason or ""), held
    leases = await client.get(f"/v1/jobs/{job}/checkpoints/2/leases")
    assert leases.status_code == 200
    assert [x["id"] for x in leases.json()["items"]] == [lease.json()["id"]]
    released = await client.delete(f"/v1/jobs/{job}/checkpoints/2/leases/{lease.json()['id']}")
    assert released.status_code == 204, released.text
    assert begin_judged(catalog, job, ids[2], "ssd").state is BeginState.EXPIRING


async def test_a_rollback_to_a_checkpoint_whose_last_copy_is_being_expired_is_refused(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """Only lustre holds the steps, and no rule keeps step 2 there: retention deletes its last
    copy. A rollback to it racing that expiry must not build a branch on bytes being deleted: it
    waits for the expiry's commit, then finds nothing restorable (409 `not_restorable`) and
    changes nothing."""
    await seed(client, catalog, job, [1, 2, 3], tiers=("lustre",))
    for step in (1, 2, 3):
        for tier in ("ssd", "s3"):
            set_marker(catalog, job, step, tier, "expired")
    create_job(sessionmaker(catalog), job, {"tiers": {"lustre": {"keep_last": 1}}})
    ids = _ids(catalog, job)
    rollback = client.post(f"/v1/jobs/{job}/rollback", json={"step": 2})
    r = await during_begin(catalog, job, ids[2], "lustre", rollback)
    assert (r.status_code, r.json()["code"]) == (409, "not_restorable"), r.text
    branches = (await client.get(f"/v1/jobs/{job}/branches")).json()
    assert branches["current"] == 1 and len(branches["items"]) == 1
    assert (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).json()["step"] == 3


async def test_a_rollback_and_a_promotion_of_a_step_it_supersedes_both_commit(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A lifecycle promotes step 3's lustre copy (the tier copy locked, then its `promoted`
    event written, whose foreign key takes KEY SHARE on the job's row) while the job rolls back
    to step 1 (the job's row locked, then the checkpoints after it and their tier copies). The
    rollback must not hold the job's row in a mode that a foreign-key check waits for: it did
    (FOR UPDATE), the two waited for each other, and Postgres ended one of them as deadlocked
    (the API answered 503 `catalog_unavailable`, or the promotion failed and was retried)."""
    await seed(client, catalog, job, [1, 2])
    await seed(client, catalog, job, [3], tiers=("ssd",))
    with catalog.connect() as conn:
        cid = conn.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = 3"
            ),
            {"job": job},
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO replica (shard_id, checkpoint_id, tier, state, location, bytes_done,"
                " verified_at) SELECT id, checkpoint_id, 'lustre', 'verified', '/lustre/' || path,"
                " size, now() FROM shard WHERE checkpoint_id = :c"
            ),
            {"c": cid},
        )
        conn.commit()

    with Session(catalog) as s:
        # The promotion's first step: its tier copy locked, as `promote` locks it.
        lock_in_order(s, tier_copies=[(cid, "lustre")])
        request = asyncio.ensure_future(
            client.post(f"/v1/jobs/{job}/rollback", json={"step": 1, "from_branch": 1})
        )
        await until_waiting(catalog, request)
        # ...then the rest of it, the event included, while the rollback waits.
        outcome = await asyncio.to_thread(promote, s, cid, "lustre", ["s3"], None)
        s.commit()
    assert outcome.state == "restorable", outcome
    r = await asyncio.wait_for(request, WAIT_LIMIT)
    assert r.status_code == 201, r.text
    assert r.json()["superseded"] == [2, 3]
    left = await client.get(f"/v1/jobs/{job}/checkpoints/3", params={"branch": 1})
    states = {t["tier"]: t["state"] for t in left.json()["tiers"]}
    assert (left.json()["superseded_by"], states["lustre"]) == (2, "restorable"), left.json()
