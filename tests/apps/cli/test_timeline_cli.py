"""The three commands a user runs after a loss spike (docs/timeline.md: `tierpoint verdict`,
`tierpoint rollback`, `tierpoint lineage`), plus `branches` and `fork`, each in its own process
against the real API served by uvicorn."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import manifest, seed, shard
from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token


async def test_roll_back_after_a_loss_spike(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30], tiers=("lustre",))
    token = create_token(catalog, scopes=[f"train:{job}", "read"])

    r = await run_cli(
        api_url, "verdict", job, "30", "bad", "--metric", "loss", "--value", "nan", token=token
    )
    assert r.exit_code == 0, r.output
    assert f"{job} step 30 (branch 1): bad" in r.output
    assert "quarantined: verdict bad: loss=NaN" in r.output

    r = await run_cli(api_url, "rollback", job, "10", "--reason", "loss spike", token=token)
    assert r.exit_code == 0, r.output
    assert f"rolled back {job} to step 10: branch 2 (from branch 1); 2 superseded: 20, 30" in (
        r.output
    )
    assert f"under <root>/{job}/<step>.b2/" in r.output
    again = await run_cli(api_url, "rollback", job, "10", token=token)
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output

    body = manifest(20, [shard("b2/0")])
    assert (await client.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201
    r = await run_cli(api_url, "lineage", job, "10", token=token)
    assert r.exit_code == 0, r.output
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in r.output.splitlines()
        if line.startswith("│")
    ]
    assert ["descendant", job, "20", "2", "", ""] in [row[:6] for row in rows], r.output
    assert ["descendant", job, "20", "1", "", "superseded"] in [row[:6] for row in rows]
    assert ["this", job, "10", "1", "", ""] in [row[:6] for row in rows]

    r = await run_cli(api_url, "branches", job, token=token)
    assert r.exit_code == 0 and "2 (current)" in r.output, r.output

    # Refusals name their code, and change nothing.
    r = await run_cli(api_url, "rollback", job, "30", token=token)
    assert r.exit_code == 1 and "checkpoint_superseded" in r.output, r.output
    r = await run_cli(api_url, "rollback", job, "99", token=token)
    assert r.exit_code == 1 and "rollback_to_future" in r.output, r.output


async def test_fork(api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    token = create_token(catalog, scopes=["admin"])
    r = await run_cli(api_url, "fork", f"{job}.sft", "--from", f"{job}:10", token=token)
    assert r.exit_code == 0, r.output
    assert f"forked {job}.sft from {job} step 10 (branch 1)" in r.output
    r = await run_cli(api_url, "fork", f"{job}.x", "--from", "nonsense", token=token)
    assert r.exit_code != 0 and "JOB:STEP" in r.output, r.output
