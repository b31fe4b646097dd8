"""POST /v1/nodes/{node}/lost: an operator declares a node lost. Its local replicas become `lost`,
local markers of checkpoints with shards there `failed`, latest restorable falls back to the other
tiers, registrations naming it are refused; a second call changes nothing; an unknown node is a
404 that changes nothing. Each test uses nodes of its own, so no other test's node is lost."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.helpers.api import counts, events, manifest, restorable, shard, workflow_count
from tests.helpers.faults import eventually
from tests.helpers.tokens import TEST_ADMIN, actor_name, as_token
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.contract.lifecycle import workflow_id


def fresh_nodes(catalog: Engine, n: int) -> list[str]:
    names = [f"node-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    with Session(catalog) as s:
        for name in names:
            upsert_node(s, name, {})
        s.commit()
    return names


def replica_states(catalog: Engine, job: str, step: int) -> dict[tuple[str, str], str]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.path, r.tier, r.state FROM replica r JOIN shard s ON s.id = r.shard_id "
                "JOIN checkpoint c ON c.id = s.checkpoint_id JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": step},
        ).all()
    return {(p, t): st for p, t, st in rows}


def markers(catalog: Engine, job: str, step: int) -> dict[str, tuple[str, str | None]]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT ct.tier, ct.state, ct.reason FROM checkpoint_tier ct "
                "JOIN checkpoint c ON c.id = ct.checkpoint_id JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = :step"
            ),
            {"job": job, "step": step},
        ).all()
    return {t: (st, r) for t, st, r in rows}


def lost_at(catalog: Engine, node: str) -> Any:
    with catalog.connect() as conn:
        return conn.scalar(text("SELECT lost_at FROM node WHERE id = :n"), {"n": node})


async def register(client: httpx.AsyncClient, job: str, step: int, shards: Any) -> None:
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(step, shards))
    assert r.status_code == 201, r.text


async def test_declaring_a_node_lost_fails_its_local_copies_and_latest_falls_back(
    client: httpx.AsyncClient, catalog: Engine, temporal: Client, job: str
) -> None:
    gone, alive = fresh_nodes(catalog, 2)
    # Step 1 reached every tier; step 2 is still in flight; step 3 never touched the lost node.
    await register(client, job, 1, [shard("a/0", gone), shard("b/0", alive)])
    for tier in ("ssd", "lustre", "s3"):
        restorable(catalog, job, 1, tier, local=tier == "ssd")
    await register(client, job, 2, [shard("a/0", gone), shard("a/1", gone)])
    await register(client, job, 3, [shard("b/0", alive)])
    restorable(catalog, job, 3, "ssd", local=True)

    async def started() -> bool:
        return await workflow_count(temporal, job, 2) > 0

    await eventually("step 2's lifecycle started", started, limit=30)

    alice = as_token(catalog, "ops-alice", ["operate"])
    r = await client.post(f"/v1/nodes/{gone}/lost", headers=alice)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["node"] == gone and body["changed"] is True
    assert body["replicas_lost"] == 1  # step 1's a/0 on ssd; step 2 had no replica yet
    assert body["markers_failed"] == 2  # the ssd markers of steps 1 and 2
    assert body["checkpoints"] == 2
    assert body["lifecycles_signalled"] == 1  # step 2's running lifecycle
    assert body["lifecycles_unreachable"] == 0
    assert lost_at(catalog, gone) is not None and lost_at(catalog, alive) is None

    assert replica_states(catalog, job, 1) == {
        ("a/0", "ssd"): "lost",
        ("b/0", "ssd"): "verified",
        ("a/0", "lustre"): "verified",
        ("b/0", "lustre"): "verified",
        ("a/0", "s3"): "verified",
        ("b/0", "s3"): "verified",
    }
    one = markers(catalog, job, 1)
    assert one["ssd"] == ("failed", f"node {gone} was declared lost: its local copies are gone")
    assert one["lustre"][0] == one["s3"][0] == "restorable"
    assert markers(catalog, job, 2)["ssd"][0] == "failed"
    assert markers(catalog, job, 2)["lustre"][0] == "pending"
    assert markers(catalog, job, 3)["ssd"][0] == "restorable"

    recorded = events(catalog, "node_lost", job=job)
    assert sorted(e["detail"]["tiers_failed"] == ["ssd"] for e in recorded) == [True, True]
    assert {e["actor"] for e in recorded} == {"ops-alice"}
    node_level = [e for e in events(catalog, "node_lost") if e["detail"].get("node") == gone]
    assert len([e for e in node_level if e["checkpoint_id"] is None]) == 1

    history = await temporal.get_workflow_handle(workflow_id(job, 2)).fetch_history()
    signals = [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert signals == ["node_lost"]

    # Latest falls back to step 1 from the shared tier, except for the surviving node, whose
    # local copy of step 3 never depended on the lost one.
    latest = await client.get(f"/v1/jobs/{job}/checkpoints/latest")
    assert latest.status_code == 200, latest.text
    assert latest.json()["step"] == 1
    assert {p["tier"] for p in latest.json()["plan"]} == {"lustre"}
    on_gone = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": gone})
    assert on_gone.json()["step"] == 1
    assert {p["tier"] for p in on_gone.json()["plan"]} == {"lustre"}
    on_alive = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": alive})
    assert on_alive.json()["step"] == 3


async def test_declaring_again_changes_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    (gone,) = fresh_nodes(catalog, 1)
    await register(client, job, 1, [shard("a/0", gone)])
    restorable(catalog, job, 1, "ssd", local=True)
    first = await client.post(f"/v1/nodes/{gone}/lost")
    assert first.status_code == 200 and first.json()["changed"] is True
    when = lost_at(catalog, gone)
    before = counts(catalog)

    again = await client.post(f"/v1/nodes/{gone}/lost")
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["changed"] is False
    assert body["replicas_lost"] == body["markers_failed"] == 0
    assert body["lost_at"] == first.json()["lost_at"]
    assert lost_at(catalog, gone) == when
    assert counts(catalog) == before
    assert actor_name(events(catalog, "node_lost", job=job)[0]["actor"]) == TEST_ADMIN


async def test_unknown_node_is_404_and_changes_nothing(
    client: httpx.AsyncClient, catalog: Engine
) -> None:
    before = counts(catalog)
    r = await client.post("/v1/nodes/no-such-node-ever/lost")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "node_not_found"
    bad = await client.post("/v1/nodes/a%00b/lost")
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    assert counts(catalog) == before


async def test_registration_naming_a_lost_node_is_refused(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    gone, alive = fresh_nodes(catalog, 2)
    assert (await client.post(f"/v1/nodes/{gone}/lost")).status_code == 200
    before = counts(catalog)
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints",
        json=manifest(5, [shard("a/0", gone), shard("b/0", alive)]),
    )
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["code"] == "unknown_node"
    assert problem["nodes"] == [gone]
    assert [e["code"] for e in problem["errors"]] == ["lost_node"]
    assert counts(catalog) == before
