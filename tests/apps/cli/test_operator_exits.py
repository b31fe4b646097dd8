"""Operator commands in their own processes against the real API, for what scripts and on-call
engineers rely on: `status --job NAME` means that job in every section; `failures ack` and
`delete` act and say so; `verify` reads every tier when `--tier` is omitted; `verify` and
`reconcile` exit 3 when they find data bad."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from tests.helpers.api import events, seed, set_marker
from tests.helpers.cli import run_cli
from tests.helpers.lifecycle import running_workers
from tests.helpers.tokens import create_token
from tierpoint.config import Settings

# Guards against a hang, not a performance assertion.
TIMEOUT = 300.0


async def cli(url: str, token: str, *args: str) -> tuple[int, str]:
    r = await asyncio.wait_for(run_cli(url, *args, token=token), TIMEOUT)
    return r.exit_code, r.output


@pytest.fixture
async def workers(settings: Settings, temporal: Client) -> AsyncIterator[None]:
    async with running_workers(settings, temporal):
        yield


async def test_status_job_means_that_job_in_every_section(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    other = f"{job}over"
    await seed(client, catalog, job, [1], tiers=("ssd", "lustre", "s3"))
    await seed(client, catalog, other, [1], tiers=("ssd", "lustre"))
    set_marker(catalog, other, 1, "s3", "failed", reason="bucket gone")
    token = create_token(catalog, scopes=["read"])
    _, out = await cli(api_url, token, "status", "--job", job, "--json")
    views = json.loads(out[out.index("{") :])
    assert [(j["job"], j["failed"]) for j in views["jobs"]["items"]] == [(job, 0)], out
    assert views["failures"]["items"] == []


async def test_failures_ack_and_delete(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2], tiers=("ssd", "lustre"))
    set_marker(catalog, job, 2, "s3", "failed", reason="bucket gone")
    set_marker(catalog, job, 1, "s3", "restorable")
    oncall = create_token(catalog, f"oncall-{job}", ["read", "operate"])
    admin = create_token(catalog, f"admin-{job}", ["admin"])

    code, out = await cli(api_url, oncall, "failures", "ack", job, "2")
    assert code == 0 and f"acknowledged {job} step 2 on s3: bucket gone" in out, out
    code, out = await cli(api_url, oncall, "failures", "ack", job, "2")
    assert code == 1 and "nothing_to_acknowledge" in out, out
    assert [e["actor"] for e in events(catalog, "acknowledged", job=job)] == [f"oncall-{job}"]

    code, out = await cli(api_url, oncall, "delete", job, "2")
    assert code == 1 and "insufficient_scope" in out, out
    code, out = await cli(api_url, admin, "delete", job, "2")
    assert code == 0 and f"deleted {job} step 2: expiring on lustre, s3, ssd" in out, out
    code, out = await cli(api_url, admin, "delete", job, "--json")
    assert code == 0, out
    answer = json.loads(out[out.index("{") :])
    assert [d["step"] for d in answer["deleted"]] == [1] and answer["already_deleted"] == [2]


async def test_verify_reads_every_tier_and_exits_3_on_damage(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str, workers: None
) -> None:
    """The catalog says every tier holds step 1, but no tier has its bytes: every tier is read
    (no --tier), each finds its replicas lost, and the exit status says so. The repair the
    first finding starts runs meanwhile and may find a later tier's copies gone first (it reads
    them as its source): that tier then reports them as no longer verified, not as good."""
    await seed(client, catalog, job, [1], tiers=("ssd", "lustre", "s3"))
    token = create_token(catalog, scopes=["read", "operate"])
    code, out = await cli(api_url, token, "verify", job, "1")
    assert code == 3, out
    assert f"{job} step 1 on ssd: read 2, 0 good, 0 corrupt, 2 lost" in out, out
    for tier in ("lustre", "s3"):
        assert (
            f"{job} step 1 on {tier}: read 2, 0 good, 0 corrupt, 2 lost" in out
            or f"{job} step 1 on {tier}: read 0, 0 good, 0 corrupt, 0 lost (0 B read good), "
            "2 skipped (no longer verified)"
            in out
        ), out


async def test_reconcile_exits_3_when_a_registered_copy_is_missing(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str, workers: None
) -> None:
    await seed(client, catalog, job, [1], tiers=("lustre",))
    token = create_token(catalog, scopes=["read", "operate"])
    code, out = await cli(api_url, token, "reconcile", "--tier", "lustre", "--job", job)
    assert code == 3, out
    assert "missing 2" in out, out
