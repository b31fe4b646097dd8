"""Every route that takes a tier refuses one that is not configured the same way: 422
`unknown_tier`, one field error on `tier` saying where it was named, and nothing changes."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import Engine

from tests.helpers.api import row_counts, seed

UNKNOWN = "nvme"


async def test_every_route_refuses_an_unknown_tier_alike(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1])
    cp = f"/v1/jobs/{job}/checkpoints/1"
    before = row_counts(catalog)
    t = {"tier": UNKNOWN}
    requests: list[tuple[str, str, str, dict[str, Any]]] = [
        ("query", "GET", f"/v1/jobs/{job}/checkpoints/latest", {"params": t}),
        ("query", "GET", f"/v1/jobs/{job}/checkpoints", {"params": t}),
        ("query", "GET", "/v1/copies/in-flight", {"params": t}),
        ("body", "POST", f"{cp}/quarantine", {"json": {"reason": "x", **t}}),
        ("query", "DELETE", f"{cp}/quarantine", {"params": t}),
        ("body", "POST", f"{cp}/verify", {"json": t}),
        ("body", "POST", f"{cp}/acknowledge", {"json": t}),
        ("body", "POST", "/v1/reconcile", {"json": t}),
    ]
    for location, method, url, kwargs in requests:
        r = await client.request(method, url, **kwargs)
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["code"] == "unknown_tier", r.text
        assert problem["detail"] == f"tier {UNKNOWN!r} is not configured; tiers are ssd, lustre, s3"
        assert problem["errors"] == [
            {
                "field": "tier",
                "location": location,
                "message": f"unknown tier {UNKNOWN!r}",
                "code": "unknown_tier",
            }
        ], r.text
    assert row_counts(catalog) == before
    detail = (await client.get(cp)).json()
    assert detail["quarantine_reason"] is None, detail
