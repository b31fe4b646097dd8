"""Recording the files a load keeps of other nodes on a node's local tier: what is recorded (never
a node's own files, nothing once the local copy is being expired), that an expiry of the local
copy deletes them on that node and forgets them, and that bad input is refused with
problem+json and changes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.api import NODE_A, NODE_B, manifest, set_marker, shard
from tests.helpers.tokens import as_token
from tierpoint.catalog.tier_copy import expiry

A_FILE, B_FILE = "__0_0.distcp", "__1_0.distcp"


def _url(job: str, step: int = 1) -> str:
    return f"/v1/jobs/{job}/checkpoints/{step}/cached-copies"


async def _register(client: httpx.AsyncClient, job: str) -> None:
    shards = [shard(A_FILE, NODE_A), shard(".metadata", NODE_A), shard(B_FILE, NODE_B)]
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(1, shards))
    assert r.status_code == 201, r.text


def _recorded(catalog: Engine, job: str) -> set[tuple[str, str, str]]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.node_id, s.path, c.tier FROM cached_copy c "
                "JOIN shard s ON s.id = c.shard_id JOIN checkpoint k ON k.id = c.checkpoint_id "
                "JOIN job j ON j.id = k.job_id WHERE j.name = :job"
            ),
            {"job": job},
        )
        return {(n, p, t) for n, p, t in rows}


def _checkpoint_id(catalog: Engine, job: str) -> int:
    with catalog.connect() as conn:
        cid: int = conn.execute(
            text("SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id WHERE j.name = :j"),
            {"j": job},
        ).scalar_one()
        return cid


async def test_other_nodes_files_are_recorded_once_and_expire_with_the_local_copy(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _register(client, job)
    trainer = as_token(catalog, "trainer", [f"train:{job}"])
    body = {
        "tier": "ssd",
        "copies": [
            {"node": NODE_B, "paths": [A_FILE, ".metadata", B_FILE]},  # B_FILE is b's own
            {"node": NODE_A, "paths": [B_FILE]},
        ],
    }
    for _ in range(2):  # recording again changes nothing
        r = await client.post(_url(job), json=body, headers=trainer)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "tier": "ssd",
            "copies": [
                {"node": NODE_A, "paths": [B_FILE]},
                {"node": NODE_B, "paths": [".metadata", A_FILE]},
            ],
        }
        assert _recorded(catalog, job) == {
            (NODE_A, B_FILE, "ssd"),
            (NODE_B, A_FILE, "ssd"),
            (NODE_B, ".metadata", "ssd"),
        }

    # The local copy's expiry: both nodes are visited, each deletes its own files and the
    # files kept there, and the rows are forgotten once the copy is expired.
    cid = _checkpoint_id(catalog, job)
    with Session(catalog) as s:
        assert set(expiry._local_nodes(s, cid, "ssd")) == {NODE_A, NODE_B}
        assert {c.path for c in expiry.registered_copies(s, cid, "ssd", NODE_A)} == {
            A_FILE,
            ".metadata",
            B_FILE,
        }
        assert {c.path for c in expiry.registered_copies(s, cid, "ssd", NODE_B)} == {
            A_FILE,
            ".metadata",
            B_FILE,
        }
    set_marker(catalog, job, 1, "ssd", "expiring")
    # Nothing more is recorded once the copy is being expired: its delete may be under way.
    late = await client.post(_url(job), json=body, headers=trainer)
    assert late.status_code == 200 and late.json()["copies"] == [], late.text
    with Session(catalog) as s, s.begin():
        assert expiry.finish_expiry(s, cid, "ssd") == "expired"
    assert _recorded(catalog, job) == set()


async def test_a_copy_being_expired_records_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _register(client, job)
    set_marker(catalog, job, 1, "ssd", "expiring")
    body = {"tier": "ssd", "copies": [{"node": NODE_B, "paths": [A_FILE]}]}
    r = await client.post(_url(job), json=body)
    assert r.status_code == 200 and r.json() == {"tier": "ssd", "copies": []}, r.text
    assert _recorded(catalog, job) == set()


def _bad(job: str) -> list[tuple[str, Any, int, str | None]]:
    ok = [{"node": NODE_B, "paths": [A_FILE]}]
    return [
        (_url(job), {"tier": "lustre", "copies": ok}, 422, "validation_error"),
        (_url(job), {"tier": "tape", "copies": ok}, 422, "unknown_tier"),
        (
            _url(job),
            {"tier": "ssd", "copies": [{"node": "nobody", "paths": [A_FILE]}]},
            422,
            "unknown_node",
        ),
        (
            _url(job),
            {"tier": "ssd", "copies": [{"node": NODE_B, "paths": ["nope"]}]},
            422,
            "validation_error",
        ),
        (_url(job), {"tier": "ssd", "copies": [{"node": NODE_B, "paths": ["a\x00b"]}]}, 422, None),
        (_url(job), {"tier": "ssd", "copies": [{"node": NODE_B, "paths": []}]}, 422, None),
        (_url(job), {"tier": "ssd", "copies": []}, 422, None),
        (_url(job), {"tier": "ssd", "copies": ok, "extra": 1}, 422, None),
        (_url(job, 2), {"tier": "ssd", "copies": ok}, 404, "checkpoint_not_found"),
        (_url("no-such-job"), {"tier": "ssd", "copies": ok}, 404, "job_not_found"),
    ]


async def test_bad_input_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _register(client, job)
    for url, body, status, code in _bad(job):
        r = await client.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        if code is not None:
            assert r.json()["code"] == code, (body, r.text)
    assert _recorded(catalog, job) == set()


@pytest.mark.parametrize("scopes", [["read"], ["train:someone-else"]])
async def test_a_token_that_may_not_lease_the_job_records_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str, scopes: list[str]
) -> None:
    await _register(client, job)
    token = as_token(catalog, "narrow", scopes)
    body = {"tier": "ssd", "copies": [{"node": NODE_B, "paths": [A_FILE]}]}
    r = await client.post(_url(job), json=body, headers=token)
    assert r.status_code == 403, r.text
    assert _recorded(catalog, job) == set()
