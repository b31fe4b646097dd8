"""A run's timeline against the workflows that move its bytes, on the real stack (API under
uvicorn, node and shared workers, Postgres, Temporal, moto over HTTP), each race ordered by
something the test holds rather than by timing:

- a rollback while the lifecycle is mid-copy to S3 of the checkpoint it supersedes and of the
  one it goes back to (both uploads held on their way to S3 by a proxy in front of moto): the
  rollback touches no copy, both copies finish, are verified and promoted, the superseded
  checkpoint stays restorable by branch and the target becomes restorable on S3 as latest;
- a fork racing the parent's retention run: the run has planned to expire the parent's
  checkpoint everywhere and its expiries wait for the checkpoint's row (held in KEY SHARE, as a
  restore choosing it holds it) when the fork commits; every expiry then finds the fork and
  keeps the copies until the child has a restorable checkpoint of its own, after which the
  parent's checkpoint goes as its policy says.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_nothing_lost
from tests.helpers.expiry_races import lock_waiters
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.hold_proxy import HoldProxy, hold_proxy
from tests.helpers.lifecycle import crc_hex, running_workers
from tests.helpers.retention import markers, settle
from tests.helpers.services import with_tier
from tests.helpers.tokens import bearer, create_token
from tests.workflows.test_rollback_resave import NODES, SIZE, restorable
from tierpoint.catalog.locks import LEASE_LOCK, lock_checkpoint
from tierpoint.config import Settings
from tierpoint.contract import retention as rc
from tierpoint.contract.retention import retention_workflow_id
from tierpoint.temporal import request_retention

WAIT = 300.0  # hang guard only
HELD = "held.bin"  # the S3 requests of shards of this name wait for the proxy's release
# Every copy stays: only the race decides what happens to the steps' copies.
KEEP_ALL = {"format": 1, "kinds": {"local": {}, "shared": {}}}
# Only the newest checkpoint anywhere, S3 included: the parent's older step may go altogether.
NEWEST_ONLY = {
    "format": 1,
    "kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}},
    "durable": {"keep_last": 1},
}


def ids_of(engine: Engine, job: str) -> dict[tuple[int, int], int]:
    """(step, branch) -> checkpoint id."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.step, c.branch, c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job"
            ),
            {"job": job},
        )
        return {(step, branch): cid for step, branch, cid in rows}


def s3_replicas(engine: Engine, cid: int) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state FROM replica WHERE checkpoint_id = :c AND tier = 's3'"), {"c": cid}
        )
        return {state for (state,) in rows}


async def policy(http: httpx.AsyncClient, job: str, spec: dict[str, Any]) -> None:
    name = f"{job}-{uuid.uuid4().hex[:6]}"
    r = await http.post("/v1/policies", json={"name": name, "spec": spec})
    assert r.status_code == 201, r.text
    r = await http.put(f"/v1/jobs/{job}/policy", json={"policy": name})
    assert r.status_code == 200, r.text


async def save(
    http: httpx.AsyncClient, settings: Settings, job: str, step: int, held: bool = False
) -> None:
    """What a training job does: its files on its nodes' local tier, then one registration.
    With `held`, node-a's file is one whose S3 requests the proxy holds."""
    shards = []
    for node in NODES:
        name = HELD if held and node == "node-a" else f"{node}.bin"
        data = os.urandom(SIZE)
        f = settings.tier("ssd").root_for(node) / job / str(step) / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        shards.append({"path": name, "size": SIZE, "crc32c": crc_hex(data), "node": node})
    r = await http.post(f"/v1/jobs/{job}/checkpoints", json={"step": step, "shards": shards})
    assert r.status_code == 201, r.text


async def in_flight_to_s3(engine: Engine, proxy: HoldProxy, ids: list[int]) -> None:
    """Until the copy of each of `ids` to S3 has begun (its replicas there `copying`, which the
    copy writes before its first byte moves) and the proxy holds an upload of each."""

    def begun() -> bool:
        return all("copying" in s3_replicas(engine, i) for i in ids)

    async with asyncio.timeout(WAIT):
        while not (proxy.held() >= len(ids) and await asyncio.to_thread(begun)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_a_rollback_while_its_target_and_the_step_it_supersedes_are_copied_to_s3(
    settings: Settings, client: Client, engine: Engine, tmp_path: Path
) -> None:
    job = f"rbcopy-{uuid.uuid4().hex[:10]}"
    train = create_token(settings.database_url, scopes=[f"train:{job}"])
    admin = create_token(settings.database_url, scopes=["admin"])
    s3 = settings.tier("s3")
    assert s3.endpoint_url is not None
    since = db_now(engine)
    with hold_proxy(s3.endpoint_url, HELD) as proxy:
        via_proxy = with_tier(settings, "s3", endpoint_url=proxy.url)
        async with (
            running_workers(via_proxy, client, nodes=NODES),
            serving(create_app(settings)) as api,
            httpx.AsyncClient(base_url=api, headers=bearer(train)) as http,
            httpx.AsyncClient(base_url=api, headers=bearer(admin)) as admin_http,
        ):
            await workers_reported_in(engine, NODES, since)
            await policy(admin_http, job, KEEP_ALL)
            await save(http, settings, job, 1)
            await restorable(http, job, 1, settings.tier_names())
            # Steps 2 and 3 reach lustre; their uploads to S3 wait at the proxy.
            await save(http, settings, job, 2, held=True)
            await save(http, settings, job, 3, held=True)
            await restorable(http, job, 2, ["ssd", "lustre"])
            await restorable(http, job, 3, ["ssd", "lustre"])
            ids = ids_of(engine, job)
            await in_flight_to_s3(engine, proxy, [ids[(2, 1)], ids[(3, 1)]])

            r = await http.post(f"/v1/jobs/{job}/rollback", json={"step": 2, "from_branch": 1})
            assert r.status_code == 201, r.text
            assert r.json()["superseded"] == [3]
            proxy.release()

            # The target's copy finishes: latest is step 2, now from S3 as well.
            await restorable(http, job, 2, settings.tier_names())
            latest = await http.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": "s3"})
            assert latest.status_code == 200, latest.text
            assert (latest.json()["step"], latest.json()["checkpoint"]["branch"]) == (2, 1)
            # The superseded step's copy finishes too, and it stays restorable by branch.
            await restorable(http, job, 3, settings.tier_names(), branch=1)
            left = await http.get(f"/v1/jobs/{job}/checkpoints/3", params={"branch": 1})
            assert left.json()["superseded_by"] == 2
            by_branch = await http.get(
                f"/v1/jobs/{job}/checkpoints/latest", params={"branch": 1, "tier": "s3"}
            )
            assert by_branch.status_code == 200, by_branch.text
            assert by_branch.json()["step"] == 3
            assert (await http.get(f"/v1/jobs/{job}/checkpoints/latest")).json()["step"] == 2

    # Nothing lost: every copy of every step verified where the catalog says, with its bytes.
    tiers = settings.tier_names()
    checked = assert_nothing_lost(settings, engine, {cid: tiers for cid in ids.values()})
    assert checked.restorable["s3"] == 3, checked


@contextmanager
def restore_choosing(engine: Engine, cid: int) -> Iterator[None]:
    """A restore choosing checkpoint `cid`, mid-transaction: its row held in KEY SHARE, which a
    retention expiry's FOR UPDATE waits for and an operator's or a fork's lock does not."""
    with Session(engine) as s:
        assert lock_checkpoint(s, cid, LEASE_LOCK)
        yield
        s.rollback()


async def expiries_waiting(client: Client, engine: Engine, job: str) -> None:
    """Until the job's retention run has planned and its expiries wait for a row lock."""
    handle = client.get_workflow_handle(retention_workflow_id(job))
    async with asyncio.timeout(WAIT):
        while True:
            pending = (await handle.describe()).raw_description.pending_activities
            begins = [a for a in pending if a.activity_type.name in (rc.BEGIN, rc.BEGIN_ROUND)]
            if begins and await asyncio.to_thread(lock_waiters, engine) > 0:
                return
            await asyncio.sleep(0.05)


async def test_a_fork_racing_the_parents_retention_run_keeps_what_the_child_needs(
    settings: Settings,
    client: Client,
    engine: Engine,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    parent = f"parent-{uuid.uuid4().hex[:8]}"
    child = f"child-{uuid.uuid4().hex[:8]}"
    admin = create_token(settings.database_url, scopes=["admin"])
    tiers = settings.tier_names()
    since = db_now(engine)
    async with (
        running_workers(settings, client, nodes=NODES),
        serving(create_app(settings)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin)) as http,
    ):
        await workers_reported_in(engine, NODES, since)
        await policy(http, parent, KEEP_ALL)
        for step in (1, 2):
            await save(http, settings, parent, step)
            await restorable(http, parent, step, tiers)
        await settle(client, parent)
        step1 = ids_of(engine, parent)[(1, 1)]

        # The parent's policy now wants only step 2 anywhere: the run plans step 1's expiry on
        # every tier, and its expiries wait while a restore holds step 1's row.
        with restore_choosing(engine, step1):
            await policy(http, parent, NEWEST_ONLY)
            await request_retention(client, parent, "test: the fork's race")
            await expiries_waiting(client, engine, parent)
            fork = await asyncio.wait_for(
                http.post(f"/v1/jobs/{child}/fork", json={"parent": {"job": parent, "step": 1}}),
                WAIT,
            )
            assert fork.status_code == 201, fork.text
        result = await settle(client, parent, request=False)
        assert result.skipped >= len(tiers), result

        # Every copy of step 1 is kept for the child, which restores it where it is.
        assert {t: markers(sessions, parent)[(1, t)] for t in tiers} == dict.fromkeys(
            tiers, "restorable"
        )
        first = await http.get(f"/v1/jobs/{child}/checkpoints/latest")
        assert first.status_code == 200, first.text
        assert (first.json()["step"], first.json()["fork_parent"]) == (1, True)
        # Another pass while the child has no checkpoint of its own keeps them still.
        await settle(client, parent)
        assert markers(sessions, parent)[(1, "s3")] == "restorable"

        # The child saves its own checkpoint: once it is restorable, step 1 may go.
        await save(http, settings, child, 1)
        await restorable(http, child, 1, tiers)
        await settle(client, parent)
        assert {t: markers(sessions, parent)[(1, t)] for t in tiers} == dict.fromkeys(
            tiers, "expired"
        )
    assert_nothing_lost(
        settings,
        engine,
        {ids_of(engine, parent)[(2, 1)]: tiers, ids_of(engine, child)[(1, 1)]: tiers},
    )
