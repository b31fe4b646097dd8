"""What the operator views mean, said once: a job filter names one job in every view (not a
prefix in one and a name in the others); promotion lag is registration -> first promotion (a
repair's promotion later is not lag); a job's steps at risk count from its newest checkpoint
restorable on the last tier and on any tier, and a tier's predicted restore time is its
recovery point's bytes over the read throughput recorded for the tier; after a rollback, a job's
latest step and its recovery points are its timeline's, as `latest` answers them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import sessionmaker

from api.pagination import encode_cursor
from tests.helpers.api import (
    SHARD_BYTES,
    manifest,
    restorable,
    seed,
    set_marker,
    set_replicas,
    shard,
)
from tierpoint.catalog.replica import scrub
from tierpoint.catalog.tier_copy.promotion import promote


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


def _restorable_at(catalog: Engine, cid: int, tier: str) -> object:
    with catalog.connect() as conn:
        return conn.execute(
            text(
                "SELECT restorable_at FROM checkpoint_tier WHERE checkpoint_id = :c AND tier = :t"
            ),
            {"c": cid, "t": tier},
        ).scalar_one()


async def test_a_repair_promotion_is_not_promotion_lag(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1], tiers=())
    cid = _checkpoint_id(catalog, job, 1)
    set_replicas(catalog, job, 1, "lustre", "verified")
    sessions = sessionmaker(catalog)
    with sessions.begin() as s:
        first = promote(s, cid, "lustre", [], None)
    assert first.state == "restorable" and first.first
    promoted_at = _restorable_at(catalog, cid, "lustre")
    lag = (await client.get("/v1/lag", params={"job": job})).json()["items"]
    assert [(x["tier"], x["count"]) for x in lag] == [("lustre", 1)]
    first_lag = lag[0]["max_seconds"]

    # A scrub found the copy bad (the marker demoted, its restorable_at kept), a repair
    # copied it back and promoted it again, later.
    with catalog.begin() as conn:
        conn.execute(text("SELECT pg_sleep(0.05)"))
    with catalog.begin() as conn:
        conn.execute(
            text(
                "UPDATE checkpoint_tier SET state = 'failed', updated_at = now() "
                "WHERE checkpoint_id = :c AND tier = 'lustre'"
            ),
            {"c": cid},
        )
    with sessions.begin() as s:
        again = promote(s, cid, "lustre", [], None)
    assert again.state == "restorable" and again.changed and not again.first
    assert _restorable_at(catalog, cid, "lustre") == promoted_at
    lag = (await client.get("/v1/lag", params={"job": job})).json()["items"]
    assert lag[0]["max_seconds"] == first_lag


async def test_a_job_filter_names_one_job_in_every_view(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """`status --job hand` read the jobs view by prefix (counting `handover`'s failure in the
    row of `hand`) and failures by name (none): now every view takes the name."""
    other = f"{job}over"
    await seed(client, catalog, job, [1], tiers=("ssd", "lustre", "s3"))
    await seed(client, catalog, other, [1], tiers=("ssd", "lustre"))
    set_marker(catalog, other, 1, "s3", "failed", reason="bucket gone")
    r = await client.get("/v1/overview/jobs", params={"job": job})
    assert r.status_code == 200, r.text
    assert [(j["job"], j["failed"]) for j in r.json()["items"]] == [(job, 0)]
    failures = (await client.get("/v1/failures", params={"job": job})).json()["items"]
    assert failures == []
    (row,) = (await client.get("/v1/overview/jobs", params={"job": other})).json()["items"]
    assert row["failed"] == 1


async def overview_row(client: httpx.AsyncClient, job: str) -> dict[str, Any]:
    r = await client.get("/v1/overview/jobs", params={"job": job})
    assert r.status_code == 200, r.text
    (row,) = r.json()["items"]
    return dict(row)


def by_tier(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {t["tier"]: t[key] for t in row["tiers"]}


async def test_steps_at_risk_and_the_predicted_restore_time(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """Step 30 is registered, 20 is restorable on ssd and lustre, 10 everywhere: a loss of the
    nodes and the shared tier costs 20 steps, a loss of what holds 20 costs 10."""
    await seed(client, catalog, job, [10, 20, 30], tiers=())
    for tier in ("ssd", "lustre", "s3"):
        restorable(catalog, job, 10, tier, local=tier == "ssd")
    for tier in ("ssd", "lustre"):
        restorable(catalog, job, 20, tier, local=tier == "ssd")
    row = await overview_row(client, job)
    assert row["latest_step"] == 30
    assert (row["steps_at_risk_durable"], row["steps_at_risk"]) == (20, 10)
    assert by_tier(row, "steps_behind") == {"ssd": 10, "lustre": 10, "s3": 20}
    # No tier was ever read back: nothing to predict from.
    assert by_tier(row, "predicted_restore_seconds") == {"ssd": None, "lustre": None, "s3": None}

    # Reads off lustre add up (2000 B in 4 s: 500 B/s); step 20 holds 2 shards there.
    sessions = sessionmaker(catalog)
    for _ in range(2):
        with sessions.begin() as s:
            scrub.record_reads(s, "lustre", 1000, 2.0)
    row = await overview_row(client, job)
    predicted = by_tier(row, "predicted_restore_seconds")
    assert predicted["lustre"] == pytest.approx(2 * SHARD_BYTES / 500)
    assert predicted["ssd"] is None and predicted["s3"] is None

    # A quarantined copy is no recovery point: nothing durable on the last tier, every step at
    # risk there (null); the newest copy anywhere is unchanged.
    set_marker(catalog, job, 10, "s3", "restorable", quarantine="bad weights")
    row = await overview_row(client, job)
    assert (row["steps_at_risk_durable"], row["steps_at_risk"]) == (None, 10)
    restorable(catalog, job, 30, "ssd", local=True)
    row = await overview_row(client, job)
    assert (row["steps_at_risk_durable"], row["steps_at_risk"]) == (None, 0)


async def test_after_a_rollback_the_latest_step_is_the_timelines(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30])
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1})
    assert r.status_code == 201, r.text
    latest = (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
    assert latest["step"] == 10

    # Steps 20 and 30 are superseded: still counted and held, but no one's latest.
    row = await overview_row(client, job)
    assert (row["latest_step"], row["checkpoints"]) == (10, 3)
    assert by_tier(row, "latest_step") == {"ssd": 10, "lustre": 10, "s3": 10}
    assert by_tier(row, "steps_behind") == {"ssd": 0, "lustre": 0, "s3": 0}
    assert (row["steps_at_risk_durable"], row["steps_at_risk"]) == (0, 0)
    # The page of jobs that starts just before this one's name.
    page: dict[str, str | int] = {"limit": 1000, "cursor": encode_cursor(job[:-1])}
    jobs = (await client.get("/v1/jobs", params=page)).json()["items"]
    assert [(j["latest_step"], j["checkpoint_count"]) for j in jobs if j["name"] == job] == [
        (10, 3)
    ]

    # The step saved again on the new branch is the job's latest again.
    shards = [shard("b2/0", size=SHARD_BYTES), shard("b2/1", size=SHARD_BYTES)]
    body = manifest(20, shards) | {"branch": 2}
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    row = await overview_row(client, job)
    assert row["latest_step"] == 20 and by_tier(row, "latest_step")["s3"] == 10
