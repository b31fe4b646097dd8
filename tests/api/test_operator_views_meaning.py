"""What the operator views mean, said once: a job filter names one job in every view (not a
prefix in one and a name in the others); promotion lag is registration -> first promotion (a
repair's promotion later is not lag)."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import sessionmaker

from tests.helpers.api import seed, set_marker, set_replicas
from tierpoint.catalog.promotion import promote


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
