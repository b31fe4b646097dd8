"""Policy CRUD, versions, events with their actor, validation, assignment and its trigger."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from tests.helpers.api import events, row_counts
from tests.helpers.tokens import actor_name, as_token
from tierpoint.contract.retention import retention_workflow_id
from tierpoint.retention.policy import DEFAULT_POLICY

KEEP2 = {"kinds": {"local": {"keep_last": 2}}}
KEEP3 = {"kinds": {"local": {"keep_last": 3}}, "durable": {"keep_every": 6}}


@pytest.fixture
def alice(catalog: Engine) -> dict[str, str]:
    """Requests with an admin token named alice: their events name alice as the actor."""
    return as_token(catalog, "alice")


async def test_create_list_show_revise_delete(
    client: httpx.AsyncClient,
    catalog: Engine,
    new_policy: Callable[[], str],
    alice: dict[str, str],
) -> None:
    name = new_policy()
    r = await client.post("/v1/policies", json={"name": name, "spec": KEEP2}, headers=alice)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["name"], body["version"], body["default"], body["jobs"]) == (name, 1, False, 0)
    assert body["spec"] == {"format": 1, **KEEP2}

    again = await client.post("/v1/policies", json={"name": name, "spec": KEEP3})
    assert again.status_code == 409 and again.json()["code"] == "policy_exists"

    listed = (await client.get("/v1/policies")).json()["items"]
    assert [p["version"] for p in listed if p["name"] == name] == [1]

    revised = await client.put(f"/v1/policies/{name}", json={"spec": KEEP3}, headers=alice)
    assert revised.status_code == 200, revised.text
    assert revised.json()["version"] == 2
    assert revised.json()["spec"]["durable"] == {"keep_every": {"steps": 6}}
    # The same document again is no new version.
    same = await client.put(f"/v1/policies/{name}", json={"spec": KEEP3})
    assert same.json()["version"] == 2
    shown = (await client.get(f"/v1/policies/{name}")).json()
    assert shown["version"] == 2 and shown["spec"] == revised.json()["spec"]

    gone = await client.delete(f"/v1/policies/{name}")
    assert gone.status_code == 204
    assert (await client.get(f"/v1/policies/{name}")).json()["code"] == "policy_not_found"
    assert (await client.delete(f"/v1/policies/{name}")).status_code == 404

    mine = [e for e in events(catalog, "policy_changed") if e["detail"]["policy"] == name]
    actions = [
        (actor_name(e["actor"]), e["detail"]["action"], e["detail"]["version"]) for e in mine
    ]
    assert actions == [
        ("alice", "created", 1),
        ("alice", "revised", 2),
        ("test-admin", "deleted", 2),
    ]
    revision = mine[1]["detail"]
    assert revision["old_spec"] == {"format": 1, **KEEP2}
    assert revision["new_spec"] == revised.json()["spec"]

    history = (await client.get(f"/v1/policies/{name}/history")).json()["items"]
    assert [h["detail"]["action"] for h in history] == ["deleted", "revised", "created"]


def _fields(body: dict[str, Any]) -> list[str]:
    return [e["field"] for e in body["errors"]]


@pytest.mark.parametrize(
    ("spec", "code", "field"),
    [
        ({"kinds": {"local": {"keep_last": -1}}}, "invalid_policy", "spec.kinds.local.keep_last"),
        ({"kinds": {"local": {"keep_lats": 2}}}, "invalid_policy", "spec.kinds.local.keep_lats"),
        ({"durable": {"keep_within": "7x"}}, "invalid_policy", "spec.durable.keep_within"),
        ({"colour": "blue"}, "invalid_policy", "spec.colour"),
        ({"tiers": {"nvme": {"keep_last": 1}}}, "unknown_tier", "spec.tiers.nvme"),
        (
            {"tiers": {"ssd": {"promote_every": 2}}},
            "invalid_policy",
            "spec.tiers.ssd.promote_every",
        ),
    ],
)
async def test_invalid_policies_name_the_field_and_change_nothing(
    client: httpx.AsyncClient,
    catalog: Engine,
    new_policy: Callable[[], str],
    spec: dict[str, Any],
    code: str,
    field: str,
) -> None:
    name = new_policy()
    before = row_counts(catalog)
    r = await client.post("/v1/policies", json={"name": name, "spec": spec})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == code
    assert field in _fields(body)
    error = next(e for e in body["errors"] if e["field"] == field)
    assert error["loc"] == field.split(".") and error["msg"]
    assert row_counts(catalog) == before

    # The same document refused as a revision of an existing policy, which stays as it was.
    ok = await client.post("/v1/policies", json={"name": name, "spec": KEEP2})
    assert ok.status_code == 201
    before = row_counts(catalog)
    bad = await client.put(f"/v1/policies/{name}", json={"spec": spec})
    assert bad.status_code == 422 and bad.json()["code"] == code
    assert row_counts(catalog) == before
    assert (await client.get(f"/v1/policies/{name}")).json()["version"] == 1


async def test_bad_requests_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    before = row_counts(catalog)
    for r in [
        await client.post("/v1/policies", json={"name": "bad/name", "spec": {}}),
        await client.post("/v1/policies", json={"name": "-x", "spec": {}}),
        await client.post("/v1/policies", json={"name": new_policy(), "spec": KEEP2, "x": 1}),
        await client.post("/v1/policies", json={"name": new_policy(), "spec": [1]}),
        await client.put(f"/v1/jobs/{job}/policy", json={"policy": "no such/policy"}),
    ]:
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "validation_error"
    missing = await client.put(f"/v1/jobs/{job}/policy", json={"policy": "pol-none-such"})
    assert missing.status_code == 404 and missing.json()["code"] == "policy_not_found"
    assert (await client.put("/v1/policies/pol-none-such", json={"spec": KEEP2})).status_code == 404
    assert row_counts(catalog) == before


async def _retention_requested(temporal: Client, job: str) -> bool:
    try:
        await temporal.get_workflow_handle(retention_workflow_id(job)).describe()
    except Exception:
        return False
    return True


async def test_assign_refuses_delete_and_requests_retention(
    client: httpx.AsyncClient,
    catalog: Engine,
    temporal: Client,
    job: str,
    new_policy: Callable[[], str],
    alice: dict[str, str],
) -> None:
    name = new_policy()
    assert (
        await client.post("/v1/policies", json={"name": name, "spec": KEEP2})
    ).status_code == 201
    # A job may get its policy before it registers anything.
    r = await client.put(f"/v1/jobs/{job}/policy", json={"policy": name}, headers=alice)
    assert r.status_code == 200, r.text
    assert r.json() | {"spec": None} == {
        "job": job,
        "source": "job",
        "name": name,
        "version": 1,
        "spec": None,
    }
    assert (await client.get(f"/v1/jobs/{job}/policy")).json()["name"] == name
    assert (await client.get(f"/v1/policies/{name}")).json()["jobs"] == 1
    # The per-job retention workflow was signal-with-started (no worker runs it in this test).
    assert await _retention_requested(temporal, job)

    refused = await client.delete(f"/v1/policies/{name}")
    assert refused.status_code == 409
    assert refused.json()["code"] == "policy_in_use" and refused.json()["jobs"] == [job]
    assert (await client.get(f"/v1/policies/{name}")).status_code == 200

    back = await client.put(f"/v1/jobs/{job}/policy", json={"policy": None})
    assert back.status_code == 200 and back.json()["source"] in ("default", "builtin")
    assert (await client.delete(f"/v1/policies/{name}")).status_code == 204

    assigned = events(catalog, "policy_changed", job=job)
    assert [
        (actor_name(e["actor"]), e["detail"]["policy"], e["detail"]["previous"]) for e in assigned
    ] == [
        ("alice", name, None),
        ("test-admin", None, name),
    ]


async def test_default_policy(
    client: httpx.AsyncClient, catalog: Engine, job: str, new_policy: Callable[[], str]
) -> None:
    first, second = new_policy(), new_policy()
    await client.put(f"/v1/jobs/{job}/policy", json={"policy": None})
    r = await client.post("/v1/policies", json={"name": first, "spec": KEEP2, "default": True})
    assert r.status_code == 201 and r.json()["default"]
    used = (await client.get(f"/v1/jobs/{job}/policy")).json()
    assert (used["source"], used["name"]) == ("default", first)

    refused = await client.delete(f"/v1/policies/{first}")
    assert refused.status_code == 409 and refused.json()["code"] == "policy_in_use"

    # A new default takes over from the old one.
    r = await client.post("/v1/policies", json={"name": second, "spec": KEEP3, "default": True})
    assert r.status_code == 201
    assert not (await client.get(f"/v1/policies/{first}")).json()["default"]
    assert (await client.get(f"/v1/jobs/{job}/policy")).json()["name"] == second

    off = await client.put(f"/v1/policies/{second}", json={"spec": KEEP3, "default": False})
    assert off.status_code == 200 and not off.json()["default"] and off.json()["version"] == 1
    assert (await client.get(f"/v1/jobs/{job}/policy")).json()["source"] == "builtin"
    assert (await client.delete(f"/v1/policies/{first}")).status_code == 204
    assert (await client.delete(f"/v1/policies/{second}")).status_code == 204


async def test_concurrent_defaults_leave_one(
    client: httpx.AsyncClient, catalog: Engine, new_policy: Callable[[], str]
) -> None:
    names = [new_policy() for _ in range(4)]
    answers = await asyncio.gather(
        *(
            client.post("/v1/policies", json={"name": n, "spec": KEEP2, "default": True})
            for n in names
        )
    )
    for r in answers:
        assert r.status_code == 201 or (
            r.status_code == 409 and r.json()["code"] == "policy_conflict"
        ), r.text
    with catalog.connect() as conn:
        defaults = (
            conn.execute(text("SELECT name FROM retention_policy WHERE is_default")).scalars().all()
        )
    assert len(defaults) == 1 and defaults[0] in names
    off = await client.put(f"/v1/policies/{defaults[0]}", json={"spec": KEEP2, "default": False})
    assert off.status_code == 200


async def test_the_builtin_policy_is_readable_by_the_name_usage_shows(
    client: httpx.AsyncClient,
) -> None:
    """Jobs with no policy run under `builtin-default` while the catalog has no default: the
    name `usage` and the retention plan print must answer, with the document it stands for."""
    r = await client.get("/v1/policies/builtin-default")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["name"] == "builtin-default" and body["version"] == 1
    assert body["spec"] == DEFAULT_POLICY.to_spec()
    assert body["created_at"] is None and body["jobs"] == 0
    history = await client.get("/v1/policies/builtin-default/history")
    assert history.status_code == 200, history.text
