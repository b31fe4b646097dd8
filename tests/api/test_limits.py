"""Size limits of every request (Settings: max_request_bytes, max_manifest_bytes,
max_metadata_bytes, max_shards_per_checkpoint): an oversized request gets a 413 problem before
anything is written, whether its size is declared or only seen while it streams in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from api.app import create_app
from tests.helpers.api import counts, manifest, row_counts, running_client, seed, shard
from tierpoint.config import Settings

PROBLEM = "application/problem+json"


@pytest.fixture
async def small_client(
    settings: Settings, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    limited = settings.model_copy(update={"max_request_bytes": 1000, "max_metadata_bytes": 200})
    async for c in running_client(create_app(limited)):
        yield c


def _assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert (r.status_code, r.headers["content-type"]) == (status, PROBLEM), r.text
    body: dict[str, Any] = r.json()
    assert body["code"] == code and body["status"] == status
    assert body["type"] == f"urn:tierpoint:problem:{code}"
    return body


async def test_twenty_megabytes_of_metadata_store_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    before = counts(catalog)
    big = manifest(1, [shard("a.bin")], blob="x" * (20 * 1024 * 1024))
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=big)
    body = _assert_problem(r, 413, "manifest_too_large")
    assert "limit is 65536 bytes" in body["detail"]
    assert body["errors"] == [
        {
            "field": "metadata",
            "location": "body",
            "message": f"{len(json.dumps(big['metadata'], separators=(',', ':')))} bytes, "
            "over 65536",
            "code": "too_large",
        }
    ]
    assert counts(catalog) == before
    # Just under the limit is fine.
    ok = manifest(1, [shard("a.bin")], blob="x" * (64 * 1024 - 20))
    assert (await client.post(f"/v1/jobs/{job}/checkpoints", json=ok)).status_code == 201


async def test_metadata_limit_is_a_setting(
    small_client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    before = counts(catalog)
    r = await small_client.post(
        f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("a")], note="é" * 100)
    )
    # Counted in UTF-8 bytes: 100 characters, 200 bytes, plus the key and braces.
    assert "limit is 200 bytes" in _assert_problem(r, 413, "manifest_too_large")["detail"]
    assert counts(catalog) == before


async def test_every_other_body_is_bounded(
    small_client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(small_client, catalog, job, [1], tiers=("lustre",))
    before = row_counts(catalog)
    url = f"/v1/jobs/{job}/checkpoints/1/quarantine"
    declared = await small_client.post(url, json={"reason": "x", "pad": "y" * 2000})
    assert "limit is 1000 bytes" in _assert_problem(declared, 413, "request_too_large")["detail"]
    assert declared.headers["connection"] == "close"

    payload = json.dumps({"name": "p-streamed", "spec": {"pad": "y" * 4000}}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 300):
            yield payload[i : i + 300]

    streamed = await small_client.post(
        "/v1/policies", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in streamed.request.headers
    _assert_problem(streamed, 413, "request_too_large")
    plan = await small_client.post(
        f"/v1/jobs/{job}/retention/plan", json={"policy": {"pad": "z" * 1500}}
    )
    _assert_problem(plan, 413, "request_too_large")
    assert row_counts(catalog) == before
    # A body under the limit on the same routes is served.
    ok = await small_client.post(url, json={"reason": "x" * 900})
    assert ok.status_code == 200, ok.text


async def test_integer_and_string_ranges(client: httpx.AsyncClient, job: str) -> None:
    cases = [
        (f"/v1/jobs/{job}/checkpoints/{2**63}", "step", "step_out_of_range"),
        (f"/v1/jobs/{job}/checkpoints/-1", "step", "validation_error"),
        (f"/v1/jobs/{job}/checkpoints?limit=0", "limit", "validation_error"),
        (f"/v1/jobs/{job}/checkpoints?limit=501", "limit", "validation_error"),
        ("/v1/jobs?limit=1001", "limit", "validation_error"),
        (f"/v1/jobs/{job}/checkpoints?cursor={'c' * 201}", "cursor", "validation_error"),
        (f"/v1/jobs/{job}/checkpoints/latest?lease_ttl=86401", "lease_ttl", "validation_error"),
        (
            f"/v1/jobs/{job}/checkpoints/latest?holder={'h' * 257}&lease_ttl=5",
            "holder",
            "validation_error",
        ),
    ]
    for url, field, code in cases:
        body = _assert_problem(await client.get(url), 422, code)
        assert body["errors"][0]["field"] == field, body
    long_name = "j" * 129
    r = await client.get(f"/v1/jobs/{long_name}/checkpoints")
    _assert_problem(r, 422, "invalid_job_name")
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints", json={"step": 2**63, "shards": [shard("a")]}
    )
    _assert_problem(r, 422, "step_out_of_range")
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("a" * 769)]))
    _assert_problem(r, 422, "unsafe_path")
