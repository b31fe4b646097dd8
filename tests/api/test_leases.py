"""Restore leases (create, renew, release, expiry), leases taken with the latest-restorable
answer, and pins, with their events."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from tests.helpers.api import NODE_A, events, manifest, row_counts, seed, shard
from tests.helpers.tokens import actor_name, as_token
from tierpoint.contract.retention import retention_workflow_id


@pytest.fixture
def bob(catalog: Engine) -> dict[str, str]:
    """Requests with an admin token named bob: their events name bob as the actor."""
    return as_token(catalog, "bob")


def _lapse(catalog: Engine, lease_id: int) -> None:
    """Move the lease's end into the past, as if its ttl had run out."""
    with catalog.begin() as conn:
        conn.execute(
            text("UPDATE restore_lease SET expires_at = now() - interval '1 second' WHERE id = :i"),
            {"i": lease_id},
        )


async def test_lease_create_renew_release(
    client: httpx.AsyncClient, catalog: Engine, temporal: Client, job: str, bob: dict[str, str]
) -> None:
    await seed(client, catalog, job, [5])
    url = f"/v1/jobs/{job}/checkpoints/5/leases"
    r = await client.post(url, json={"ttl_seconds": 60, "holder": "rank-0"}, headers=bob)
    assert r.status_code == 201, r.text
    lease = r.json()
    assert (lease["job"], lease["step"], lease["holder"], lease["active"]) == (
        job,
        5,
        "rank-0",
        True,
    )
    assert lease["expires_at"] > lease["created_at"]
    assert [x["id"] for x in (await client.get(url)).json()["items"]] == [lease["id"]]

    renewed = await client.put(f"{url}/{lease['id']}", json={"ttl_seconds": 3600})
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["expires_at"] > lease["expires_at"]

    for _ in range(2):  # idempotent
        gone = await client.delete(f"{url}/{lease['id']}", headers=bob)
        assert gone.status_code == 204
    assert (await client.get(url)).json()["items"] == []
    ended = (await client.get(url, params={"all": "true"})).json()["items"]
    assert ended[0]["released_at"] is not None and not ended[0]["active"]
    late = await client.put(f"{url}/{lease['id']}", json={"ttl_seconds": 60})
    assert late.status_code == 409 and late.json()["code"] == "lease_ended"

    leased = events(catalog, "leased", job=job)
    actions = [(actor_name(e["actor"]), e["detail"]["action"]) for e in leased]
    assert actions == [("bob", "created"), ("test-admin", "renewed"), ("bob", "released")]
    # The release asked for a retention run of the job.
    await temporal.get_workflow_handle(retention_workflow_id(job)).describe()


async def _pages(client: httpx.AsyncClient, url: str, **params: str) -> list[list[int]]:
    pages: list[list[int]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor is not None else {})}
        r = await client.get(url, params=query)
        assert r.status_code == 200, r.text
        pages.append([x["id"] for x in r.json()["items"]])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return pages


async def test_a_checkpoints_leases_list_a_page_at_a_time(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A restart storm leaves thousands of leases on one checkpoint: the list comes in pages
    (limit and an opaque cursor, as every other list), and a cursor this API did not return is a
    422 problem that reads nothing."""
    await seed(client, catalog, job, [5])
    url = f"/v1/jobs/{job}/checkpoints/5/leases"
    ids = []
    for rank in range(5):
        r = await client.post(url, json={"ttl_seconds": 600, "holder": f"rank-{rank}"})
        ids.append(r.json()["id"])
    assert (await client.delete(f"{url}/{ids[1]}")).status_code == 204
    active = [i for i in ids if i != ids[1]]
    assert await _pages(client, url, limit="3") == [active[:3], active[3:]]
    assert await _pages(client, url, limit="2", all="true") == [ids[:2], ids[2:4], ids[4:]]
    assert await _pages(client, url) == [active]
    before = row_counts(catalog)
    for bad in ("not-a-cursor", "eyJ2IjoxLCJrIjoiYSJ9", "e30"):  # garbage; a name's key; {}
        r = await client.get(url, params={"cursor": bad})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert [e["code"] for e in r.json()["errors"]] == ["invalid_cursor"]
    for limit in ("0", "1001"):
        r = await client.get(url, params={"limit": limit})
        assert r.status_code == 422 and r.json()["code"] == "validation_error", r.text
    assert row_counts(catalog) == before


async def test_expired_lease_cannot_be_renewed_and_no_longer_holds(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2, 3])
    url = f"/v1/jobs/{job}/checkpoints/1/leases"
    lease = (await client.post(url, json={"ttl_seconds": 60})).json()
    spec = {"kinds": {"local": {"keep_last": 1}}}
    body = (await client.post(f"/v1/jobs/{job}/retention/plan", json={"policy": spec})).json()
    assert ("ssd", 1) not in {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}

    _lapse(catalog, lease["id"])
    assert (await client.get(url)).json()["items"] == []
    r = await client.put(f"{url}/{lease['id']}", json={"ttl_seconds": 60})
    assert r.status_code == 409 and r.json()["code"] == "lease_ended"
    body = (await client.post(f"/v1/jobs/{job}/retention/plan", json={"policy": spec})).json()
    assert ("ssd", 1) in {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}


async def test_lease_refusals_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [7])
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(8, [shard("x", NODE_A)]))
    assert r.status_code == 201
    before = row_counts(catalog)
    base = f"/v1/jobs/{job}/checkpoints"
    for body in ({"ttl_seconds": 0}, {"ttl_seconds": 86401}, {}, {"ttl_seconds": 5, "x": 1}):
        bad = await client.post(f"{base}/7/leases", json=body)
        assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    pending = await client.post(f"{base}/8/leases", json={"ttl_seconds": 60})
    assert pending.status_code == 409 and pending.json()["code"] == "not_leasable"
    missing = await client.post(f"{base}/9/leases", json={"ttl_seconds": 60})
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"
    assert (
        await client.put(f"{base}/7/leases/999999999", json={"ttl_seconds": 5})
    ).status_code == 404
    assert (await client.delete(f"{base}/7/leases/999999999")).status_code == 404
    assert (await client.put(f"{base}/9/pin")).status_code == 404
    assert row_counts(catalog) == before


async def test_latest_with_lease(
    client: httpx.AsyncClient, catalog: Engine, job: str, bob: dict[str, str]
) -> None:
    await seed(client, catalog, job, [10, 20], tiers=("lustre",))
    await seed(client, catalog, job, [30], tiers=())
    url = f"/v1/jobs/{job}/checkpoints/latest"
    plain = (await client.get(url)).json()
    assert plain["step"] == 20 and plain["lease"] is None

    before = row_counts(catalog)
    r = await client.get(url, params={"lease_ttl": 300, "holder": "restart-1"}, headers=bob)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["step"] == 20
    lease = body["lease"]
    assert (lease["step"], lease["holder"], lease["active"]) == (20, "restart-1", True)
    after = row_counts(catalog)
    assert after["restore_lease"] == before["restore_lease"] + 1
    leases = (await client.get(f"/v1/jobs/{job}/checkpoints/20/leases")).json()["items"]
    assert [x["id"] for x in leases] == [lease["id"]]
    assert events(catalog, "leased", job=job)[0]["actor"] == "bob"

    bad = await client.get(url, params={"lease_ttl": 0})
    assert bad.status_code == 422
    none = await client.get(url, params={"lease_ttl": 60, "tier": "s3"})
    assert none.status_code == 404 and none.json()["code"] == "no_restorable_checkpoint"
    assert row_counts(catalog) == after


async def test_pin_unpin_events(
    client: httpx.AsyncClient, catalog: Engine, job: str, bob: dict[str, str]
) -> None:
    await seed(client, catalog, job, [3])
    url = f"/v1/jobs/{job}/checkpoints/3/pin"
    assert (await client.put(url, headers=bob)).json()["changed"]
    again = await client.put(url)
    assert again.json() == {"job": job, "step": 3, "pinned": True, "changed": False}
    assert (await client.get(f"/v1/jobs/{job}/checkpoints/3")).json()["pinned"]
    assert (await client.delete(url, headers=bob)).json()["changed"]
    assert not (await client.get(f"/v1/jobs/{job}/checkpoints/3")).json()["pinned"]
    assert [e["actor"] for e in events(catalog, "pinned", job=job)] == ["bob"]
    assert [e["actor"] for e in events(catalog, "unpinned", job=job)] == ["bob"]
