"""Latest restorable checkpoint and restore plan, with catalog rows set as the workflow would."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from api.app import create_app
from apps.devstack.services import free_port
from tests.helpers.api import (
    NODE_A,
    NODE_B,
    manifest,
    quarantine_checkpoint,
    restorable,
    running_client,
    seed,
    set_marker,
    set_replicas,
    shard,
)
from tierpoint.config import Settings


async def _register(
    client: httpx.AsyncClient, job: str, step: int, shards: list[dict[str, Any]]
) -> None:
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(step, shards))
    assert r.status_code == 201, r.text


def _two_nodes() -> list[dict[str, Any]]:
    return [
        shard("a0", NODE_A, 100),
        shard("a1", NODE_A, 100),
        shard("b0", NODE_B, 100),
        shard("b1", NODE_B, 100),
    ]


def _reasons(body: dict[str, Any]) -> dict[int, list[str]]:
    return {s["step"]: s["reasons"] for s in body["skipped"]}


async def test_no_checkpoint_at_all(client: httpx.AsyncClient, job: str) -> None:
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "no_restorable_checkpoint"
    bad_node = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": "a\x00b"})
    assert bad_node.status_code == 422 and bad_node.json()["code"] == "validation_error"
    assert bad_node.json()["errors"][0]["field"] == "node"


async def test_local_only_checkpoint_needs_the_callers_node(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _register(client, job, 10, [shard("x/0", NODE_A), shard("x/1", NODE_A)])
    url = f"/v1/jobs/{job}/checkpoints/latest"

    nobody = await client.get(url)
    assert nobody.status_code == 404
    assert _reasons(nobody.json()) == {
        10: [
            "ssd: pending, 0/2 shards verified",
            "lustre: pending, 0/2 shards verified",
            "s3: pending, 0/2 shards verified",
        ]
    }

    restorable(catalog, job, 10, "ssd", local=True)
    anonymous = await client.get(url)
    assert anonymous.status_code == 404
    assert (
        _reasons(anonymous.json())[10][0] == "ssd: node-local copy; pass node= to restore from it"
    )

    mine = await client.get(url, params={"node": NODE_A})
    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["step"] == 10 and body["skipped"] == []
    assert body["checkpoint"]["tiers"][0]["state"] == "restorable"
    assert body["plan"] == [
        {
            "path": "x/0",
            "size": 10,
            "crc32c": "0badf00d",
            "tier": "ssd",
            "kind": "local",
            "node": NODE_A,
            "location": f"/ssd/{NODE_A}/{job}/10/x/0",
            "bucket": None,
            "key": None,
            "url": None,
            "code": None,
            "stripes": None,
        },
        {
            "path": "x/1",
            "size": 10,
            "crc32c": "0badf00d",
            "tier": "ssd",
            "kind": "local",
            "node": NODE_A,
            "location": f"/ssd/{NODE_A}/{job}/10/x/1",
            "bucket": None,
            "key": None,
            "url": None,
            "code": None,
            "stripes": None,
        },
    ]

    other = await client.get(url, params={"node": NODE_B})
    assert other.status_code == 404
    assert _reasons(other.json())[10][0] == f"ssd: only on nodes {NODE_A} (caller {NODE_B})"

    only_s3 = await client.get(url, params={"node": NODE_A, "tier": "s3"})
    assert only_s3.status_code == 404
    assert _reasons(only_s3.json()) == {10: ["s3: pending, 0/2 shards verified"]}


@pytest.mark.query_unit
async def test_lost_local_replicas_no_longer_count(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A unit test of the latest query: one replica's `lost` state is written here with SQL (the
    operator action that declares a whole node lost is tests/api/test_node_lost.py)."""
    await _register(client, job, 10, [shard("x/0", NODE_A), shard("x/1", NODE_A)])
    restorable(catalog, job, 10, "ssd", local=True)
    url = f"/v1/jobs/{job}/checkpoints/latest"
    assert (await client.get(url, params={"node": NODE_A})).status_code == 200

    with catalog.begin() as conn:
        conn.execute(
            text("UPDATE replica SET state = 'lost' WHERE location LIKE :loc"),
            {"loc": f"%/{job}/10/x/1"},
        )
    gone = await client.get(url, params={"node": NODE_A})
    assert gone.status_code == 404
    assert _reasons(gone.json())[10][0] == "ssd: restorable but 1 lost replicas"


async def _steps_held_back(client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    """Steps 10 to 40 of two nodes' shards, each newer one held back for another reason."""
    for step in (10, 20, 30, 40):
        await _register(client, job, step, _two_nodes())
    # 10: on every node's ssd and on lustre.
    restorable(catalog, job, 10, "ssd", local=True)
    restorable(catalog, job, 10, "lustre")
    # 20: sealed locally; one shard verified and one copying on lustre; s3 failed.
    restorable(catalog, job, 20, "ssd", local=True)
    set_replicas(catalog, job, 20, "lustre", "verified", paths=["a0"])
    set_replicas(catalog, job, 20, "lustre", "copying", paths=["a1"])
    set_marker(catalog, job, 20, "s3", "failed", reason="crc32c mismatch on b0")
    # 30: fully on lustre but the checkpoint is quarantined (a job failed to load it).
    restorable(catalog, job, 30, "lustre")
    quarantine_checkpoint(catalog, job, 30, "loss is NaN after load")
    # 40: lustre copy quarantined.
    restorable(catalog, job, 40, "lustre")
    set_marker(catalog, job, 40, "lustre", "restorable", quarantine="short read on verify")


async def test_plan_picks_fastest_source_and_explains_newer_steps(
    client: httpx.AsyncClient, catalog: Engine, job: str, settings: Settings
) -> None:
    await _steps_held_back(client, catalog, job)
    url = f"/v1/jobs/{job}/checkpoints/latest"
    r = await client.get(url, params={"node": NODE_A})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["step"] == 10
    sources = {p["path"]: (p["tier"], p["node"]) for p in body["plan"]}
    assert sources == {
        "a0": ("ssd", NODE_A),
        "a1": ("ssd", NODE_A),
        "b0": ("lustre", None),
        "b1": ("lustre", None),
    }
    assert body["plan"][2]["location"] == f"/lustre/{job}/10/b0"
    assert body["plan"][2]["kind"] == "shared"
    assert [s["step"] for s in body["skipped"]] == [40, 30, 20]
    assert _reasons(body) == {
        40: [
            "ssd: pending, 0/4 shards verified",
            "lustre: quarantined: short read on verify",
            "s3: pending, 0/4 shards verified",
        ],
        30: ["quarantined: loss is NaN after load"],
        20: [
            f"ssd: spread over nodes {NODE_A}, {NODE_B}, not all on caller {NODE_A}",
            "lustre: copying, 1/4 shards verified",
            "s3: failed: crc32c mismatch on b0",
        ],
    }

    anonymous = (await client.get(url)).json()
    assert anonymous["step"] == 10
    assert {p["tier"] for p in anonymous["plan"]} == {"lustre"}
    assert _reasons(anonymous)[20][0] == "ssd: node-local copy; pass node= to restore from it"

    lustre = (await client.get(url, params={"tier": "lustre", "node": NODE_A})).json()
    assert lustre["step"] == 10 and {p["tier"] for p in lustre["plan"]} == {"lustre"}
    assert _reasons(lustre)[20] == ["lustre: copying, 1/4 shards verified"]

    none_on_s3 = await client.get(url, params={"tier": "s3"})
    assert none_on_s3.status_code == 404
    assert _reasons(none_on_s3.json())[20] == ["s3: failed: crc32c mismatch on b0"]

    unknown = await client.get(url, params={"tier": "tape"})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_tier"

    # 20 reaches s3: now the newest for everyone, local copies still preferred on the node.
    set_marker(catalog, job, 20, "s3", "pending")
    restorable(catalog, job, 20, "s3")
    r = (await client.get(url, params={"node": NODE_B})).json()
    assert r["step"] == 20
    assert {p["path"]: p["tier"] for p in r["plan"]} == {
        "a0": "s3",
        "a1": "s3",
        "b0": "ssd",
        "b1": "ssd",
    }
    assert r["plan"][0]["location"] == f"s3://bucket/{job}/20/a0"
    # Readers get the object as data: (bucket, key) of the tier, never a string to parse.
    s3 = settings.tier("s3")
    key = f"{s3.prefix}{job}/20/a0"
    assert (r["plan"][0]["bucket"], r["plan"][0]["key"]) == (s3.bucket, key)
    assert (r["plan"][2]["bucket"], r["plan"][2]["key"]) == (None, None)  # a local copy
    assert [s["step"] for s in r["skipped"]] == [40, 30]

    detail = (await client.get(f"/v1/jobs/{job}/checkpoints/20")).json()
    lustre_status = next(t for t in detail["tiers"] if t["tier"] == "lustre")
    assert lustre_status["state"] == "pending"
    # One verified (100 bytes) and one copying (half of 100 bytes recorded).
    assert lustre_status["progress"] == {
        "shards_total": 4,
        "shards_verified": 1,
        "bytes_total": 400,
        "bytes_done": 150,
    }
    a0 = next(s for s in detail["shards"] if s["path"] == "a0")
    assert [(x["tier"], x["state"]) for x in a0["replicas"]] == [
        ("ssd", "verified"),
        ("lustre", "verified"),
        ("s3", "verified"),
    ]
    assert [(x["bucket"], x["key"]) for x in a0["replicas"]] == [
        (None, None),
        (None, None),
        (s3.bucket, key),
    ]


async def test_marker_without_replicas_is_not_trusted(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _register(client, job, 1, _two_nodes())
    await _register(client, job, 2, _two_nodes())
    restorable(catalog, job, 1, "s3")
    # A marker that claims restorable while the catalog has no verified replica for two shards.
    set_replicas(catalog, job, 2, "s3", "verified", paths=["a0", "b0"])
    set_marker(catalog, job, 2, "s3", "restorable")
    body = (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
    assert body["step"] == 1
    assert _reasons(body)[2][-1] == "s3: restorable but only 2/4 shards have a verified replica"


async def test_skipped_is_bounded(
    settings: Settings, nodes: tuple[str, str], catalog: Engine, job: str
) -> None:
    # Temporal is not needed to register; leaving it out keeps 100 workflows off the server.
    down = settings.model_copy(update={"temporal_address": f"127.0.0.1:{free_port()}"})
    async for client in running_client(create_app(down)):
        for step in range(103):
            await _register(client, job, step, [shard("only", NODE_A)])
        restorable(catalog, job, 0, "lustre")
        body = (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
    assert body["step"] == 0
    steps = [s["step"] for s in body["skipped"]]
    assert steps[:100] == list(range(102, 2, -1))
    assert steps[100] == 2
    assert body["skipped"][100]["reasons"][0].startswith("not examined: only the 100 newest")
    assert len(steps) == 101


async def test_a_node_nobody_knows_is_refused(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A reader's node that no worker reported from (a typo) is not taken for a node holding no
    local copies: 422 `unknown_node`, naming it."""
    await seed(client, catalog, job, [10], tiers=("ssd", "lustre"))
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": "node-typo"})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "unknown_node" and r.json()["nodes"] == ["node-typo"]
    known = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params={"node": NODE_A})
    assert known.status_code == 200 and known.json()["step"] == 10
