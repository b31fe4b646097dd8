"""Sizes the catalog cannot count are refused; any sum of accepted ones is counted exactly.

An attacker with a train token registered a shard of 2^63 - 1 bytes (accepted then): deleting
that checkpoint, or its job, answered 500 (`bigint out of range` in the usage trigger), even with
`force`. Now a shard and a checkpoint hold at most 2^53 - 1 bytes (422 `size_out_of_range`,
nothing written: tests/api/test_bad_input.py), and a job's usage per tier is a numeric running
total: however many checkpoints of the largest size are held, deleting them answers 202 and
every view counts them exactly.
"""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import Engine

from tests.helpers.api import counts, manifest, shard

# The largest shard and checkpoint size registration accepts (stated here, not imported).
MAX_BYTES = 2**53 - 1

# One more than 2^63 / (2^53 - 1): enough checkpoints of the largest size to overflow a BIGINT.
OVERFLOWING = 2**63 // MAX_BYTES + 1
TIERS = ("lustre", "s3", "ssd")


async def test_the_largest_shard_before_the_limit_was_refused_changes_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    before = counts(catalog)
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints", json=manifest(1, [shard("huge", size=2**63 - 1)])
    )
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["code"] == "size_out_of_range", problem
    assert [e["code"] for e in problem["errors"]] == ["size_out_of_range"], problem
    assert counts(catalog) == before


async def test_deleting_a_job_holding_more_than_2_63_bytes_answers_202_and_counts_exactly(
    client: httpx.AsyncClient, job: str
) -> None:
    """Each checkpoint is one shard of the largest accepted size; the deletion sends all of them
    to expiry at once, so each tier's running total for the job passes 2^63 bytes."""
    gate = asyncio.Semaphore(8)

    async def register(step: int) -> None:
        async with gate:
            body = manifest(step, [shard("model.bin", size=MAX_BYTES)])
            r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
            assert r.status_code == 201, r.text

    await asyncio.gather(*(register(step) for step in range(OVERFLOWING)))

    r = await client.delete(f"/v1/jobs/{job}", params={"force": "true"})
    assert r.status_code == 202, r.text
    assert len(r.json()["deleted"]) == OVERFLOWING

    held = OVERFLOWING * MAX_BYTES
    assert held > 2**63 - 1
    (row,) = (await client.get("/v1/overview/jobs", params={"job": job})).json()["items"]
    assert {t["tier"]: (t["bytes"], t["checkpoints"]) for t in row["tiers"]} == {
        tier: (held, OVERFLOWING) for tier in TIERS
    }
    usage = await client.get("/v1/tiers/usage")
    assert usage.status_code == 200, usage.text
    for tier in usage.json()["items"]:
        if tier["tier"] in TIERS:
            mine = [j for j in tier["jobs"] if j["job"] == job]
            assert mine == [{"job": job, "bytes": held, "checkpoints": OVERFLOWING}], tier
