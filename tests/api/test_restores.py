"""Starting a restore: one request answers which step, from where (every copy of every file, and
the tiers) and under which lease; bad input is refused with problem+json and changes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from tests.helpers.api import NODE_A, events, manifest, row_counts, seed, shard
from tests.helpers.tokens import as_token
from tierpoint.manifest import MAX_STEP


def _url(job: str) -> str:
    return f"/v1/jobs/{job}/restores"


async def test_latest_step_under_a_lease_with_every_copy_in_one_answer(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2])
    r = await client.post(_url(job), json={"ttl_seconds": 60, "holder": "dcp-load", "node": NODE_A})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["job"], body["step"], body["skipped"]) == (job, 2, [])
    lease = body["lease"]
    assert (lease["step"], lease["holder"], lease["active"]) == (2, "dcp-load", True)
    # The lease is the catalog's: listed on the step, and recorded as an event.
    listed = (await client.get(f"/v1/jobs/{job}/checkpoints/2/leases")).json()["items"]
    assert [x["id"] for x in listed] == [lease["id"]]
    assert [e["detail"]["action"] for e in events(catalog, "leased", job=job)] == ["created"]
    # Every file with every copy, and the tiers those copies are on, as the detail lists them.
    detail = (await client.get(f"/v1/jobs/{job}/checkpoints/2")).json()
    assert body["checkpoint"]["shards"] == detail["shards"]
    assert {r["tier"] for s in body["checkpoint"]["shards"] for r in s["replicas"]} == {
        "ssd",
        "lustre",
        "s3",
    }
    assert [t["name"] for t in body["tiers"]] == ["ssd", "lustre", "s3"]


async def test_a_given_step_and_the_steps_skipped_on_a_tier(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1])
    await seed(client, catalog, job, [2], tiers=("ssd",))
    given = await client.post(_url(job), json={"ttl_seconds": 60, "step": 1})
    assert given.status_code == 201, given.text
    assert (given.json()["step"], given.json()["lease"]["step"]) == (1, 1)
    on_s3 = await client.post(_url(job), json={"ttl_seconds": 60, "tier": "s3"})
    assert on_s3.status_code == 201, on_s3.text
    assert on_s3.json()["step"] == 1
    assert [s["step"] for s in on_s3.json()["skipped"]] == [2]


async def test_a_train_token_of_the_job_may_start_a_restore_a_reader_may_not(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1])
    trainer = as_token(catalog, "trainer", [f"train:{job}"])
    r = await client.post(_url(job), json={"ttl_seconds": 60}, headers=trainer)
    assert r.status_code == 201, r.text
    reader = as_token(catalog, "reader", ["read"])
    before = row_counts(catalog)
    refused = await client.post(_url(job), json={"ttl_seconds": 60}, headers=reader)
    assert refused.status_code == 403, refused.text
    assert row_counts(catalog) == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 422, None),  # ttl_seconds is required
        ({"ttl_seconds": 0}, 422, None),
        ({"ttl_seconds": "60"}, 422, None),
        ({"ttl_seconds": 60, "step": "1"}, 422, None),
        ({"ttl_seconds": 60, "step": -1}, 422, None),
        ({"ttl_seconds": 60, "step": MAX_STEP + 1}, 422, "step_out_of_range"),
        ({"ttl_seconds": 60, "lease": 5}, 422, None),
        ({"ttl_seconds": 60, "holder": ""}, 422, None),
        ({"ttl_seconds": 60, "tier": "tape"}, 422, "unknown_tier"),
        ({"ttl_seconds": 60, "node": "no-such-node"}, 422, "unknown_node"),
        ({"ttl_seconds": 60, "step": 9}, 404, "checkpoint_not_found"),
        ({"ttl_seconds": 60, "step": 3}, 409, "not_leasable"),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    body: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    await seed(client, catalog, job, [1])
    # Step 3 is registered, copied nowhere yet: restorable from no tier.
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(3, [shard("s3/0")]))
    assert r.status_code == 201, r.text
    before = row_counts(catalog)
    refused = await client.post(_url(job), json=body)
    assert refused.status_code == status, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    if code is not None:
        assert refused.json()["code"] == code, refused.json()
    assert row_counts(catalog) == before


async def test_a_job_with_nothing_restorable_is_a_404(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    before = row_counts(catalog)
    r = await client.post(_url(job), json={"ttl_seconds": 60})
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "no_restorable_checkpoint"
    assert row_counts(catalog) == before
    bad = await client.post("/v1/jobs/-bad/restores", json={"ttl_seconds": 60})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_job_name", bad.text


async def test_the_endpoint_is_described_in_openapi(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    op = spec["paths"]["/v1/jobs/{job}/restores"]["post"]
    assert "lease" in op["description"]
    for status in ("404", "409", "422"):
        content = op["responses"][status]["content"]
        assert content["application/problem+json"]["schema"]["$ref"].endswith("/Problem")
