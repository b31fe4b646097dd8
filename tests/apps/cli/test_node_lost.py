"""`tierpoint node-lost NODE` and `tierpoint nodes` against the real API, as an operator runs
them."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token
from tierpoint.catalog.node.registry import upsert_node, upsert_nodes


async def _run(api_url: str, token: str, *args: str) -> tuple[int, str]:
    r = await run_cli(api_url, "node-lost", *args, token=token)
    return r.exit_code, r.output


async def test_node_lost_declares_once_then_reports_it_was_lost(
    api_url: str, catalog: Engine
) -> None:
    node = f"node-{uuid.uuid4().hex[:10]}"
    with Session(catalog) as s:
        upsert_node(s, node, {})
        s.commit()

    bob = create_token(catalog, "ops-bob", ["operate"])
    code, out = await _run(api_url, bob, node)
    assert code == 0, out
    assert f"node {node} declared lost" in out
    code, out = await _run(api_url, bob, node)
    assert code == 0, out
    assert f"node {node} was lost already" in out
    with catalog.connect() as conn:
        actors = conn.scalars(
            text(
                "SELECT actor FROM event WHERE kind = 'node_lost' AND detail->>'node' = :n "
                "AND checkpoint_id IS NULL"
            ),
            {"n": node},
        ).all()
    assert actors == ["ops-bob"]

    code, out = await _run(api_url, bob, "never-reported-in")
    assert code == 1
    assert "node_not_found" in out


async def test_nodes_lists_each_node_with_its_failure_domain(api_url: str, catalog: Engine) -> None:
    tag = uuid.uuid4().hex[:6]
    racked, bare = f"n{tag}r", f"n{tag}b"
    with Session(catalog) as s:
        upsert_nodes(s, {racked: {}, bare: {}}, domains={racked: f"rk{tag}"})
        s.commit()
    reader = create_token(catalog, f"reader-{tag}", ["read"])
    r = await run_cli(api_url, "nodes", "--json", token=reader)
    assert r.exit_code == 0, r.output
    found = {n["id"]: n["failure_domain"] for n in json.loads(r.output)["items"]}
    assert found[racked] == f"rk{tag}" and found[bare] is None

    r = await run_cli(api_url, "nodes", token=reader)
    assert r.exit_code == 0, r.output
    rows = {line.split()[1]: line for line in r.output.splitlines() if f"n{tag}" in line}
    assert f"rk{tag}" in rows[racked] and "ok" in rows[racked], r.output
    assert "(own)" in rows[bare], r.output
