"""GET /v1/nodes: every node that reported in, with the failure domain its worker reported with
its heartbeat (null for a node without one: a domain of its own), as placement reads it."""

from __future__ import annotations

import uuid

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.helpers.tokens import as_token
from tierpoint.catalog.node.registry import upsert_nodes


async def test_nodes_show_the_failure_domain_each_worker_reported(
    client: httpx.AsyncClient, catalog: Engine
) -> None:
    tag = uuid.uuid4().hex[:8]
    racked, bare = f"node-{tag}-r", f"node-{tag}-b"
    with Session(catalog) as s:
        # As a worker serving two nodes reports them in: one labelled, one not.
        upsert_nodes(s, {racked: {}, bare: {}}, domains={racked: f"rack-{tag}"})
        s.commit()
    reader = as_token(catalog, f"reader-{tag}", ["read"])
    r = await client.get("/v1/nodes", headers=reader)
    assert r.status_code == 200, r.text
    found = {n["id"]: n for n in r.json()["items"]}
    assert found[racked]["failure_domain"] == f"rack-{tag}"
    assert found[bare]["failure_domain"] is None and "failure_domain" in found[bare]

    # A worker that reports a new label (the node moved racks) is shown with it.
    with Session(catalog) as s:
        upsert_nodes(s, {racked: {}}, domains={racked: f"zone-{tag}"})
        s.commit()
    r = await client.get("/v1/nodes", headers=reader)
    assert {n["id"]: n for n in r.json()["items"]}[racked]["failure_domain"] == f"zone-{tag}"
