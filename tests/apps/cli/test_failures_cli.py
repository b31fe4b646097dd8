"""The failures an operator finds with `tierpoint status` after a dev restart that lost the S3
copies no other tier held (22 of them, over two jobs), and clears with one command: each command
run as a process against the real API on a real catalog.

`status` cuts the list at 20 and says "20 of 22"; each failure says that no retry can help and
why, instead of a retry that would only be refused; `failures list --reason` shows what a
reason matches; `failures ack --reason` acknowledges them all, recorded per checkpoint with the
token's name; `failures ack JOB` clears one job's."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import events, seed, set_marker, set_replicas
from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token

LOST = "2 shard(s) lost on s3 (found by reconcile): s{step}/0 (reconcile: missing on s3)"


async def only_on_s3_then_lost(
    client: httpx.AsyncClient, catalog: Engine, job: str, steps: range
) -> None:
    """Retention kept these only on S3, and the restart's reconciliation found them gone."""
    await seed(client, catalog, job, list(steps), tiers=())
    for step in steps:
        for tier in ("ssd", "lustre"):
            set_replicas(catalog, job, step, tier, "expired", local=tier == "ssd")
            set_marker(catalog, job, step, tier, "expired")
        set_replicas(catalog, job, step, "s3", "lost")
        set_marker(catalog, job, step, "s3", "failed", reason=LOST.format(step=step))


async def test_status_counts_the_cut_list_and_one_command_clears_failures_no_retry_can_help(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    other = f"{job}-b"
    await only_on_s3_then_lost(client, catalog, job, range(1, 13))
    await only_on_s3_then_lost(client, catalog, other, range(1, 11))
    token = create_token(catalog, f"oncall-{job}", ["read", "operate"])

    shown = await run_cli(api_url, "status", token=token)
    assert "failures (20 of 22)" in shown.output, shown.output
    # (The table folds the cell: each part on its line.)
    gone = "no retry can help: the copies a new run would start from are gone"
    assert gone in shown.output and "(no_verified_source)" in shown.output, shown.output
    assert "tierpoint retry" not in shown.output, shown.output
    assert "tierpoint failures ack --reason TEXT" in shown.output, shown.output

    listed = await run_cli(api_url, "failures", "list", "--reason", "LOST ON S3", token=token)
    assert listed.exit_code == 0 and "failures (22)" in listed.output, listed.output

    r = await run_cli(api_url, "failures", "ack", other, token=token)
    assert r.exit_code == 0 and "10 failure(s) acknowledged" in r.output, r.output
    r = await run_cli(api_url, "failures", "ack", "--reason", "lost on s3", token=token)
    assert r.exit_code == 0 and "12 failure(s) acknowledged" in r.output, r.output
    assert f"acknowledged {job} step 12 on s3: 2 shard(s) lost on s3" in r.output, r.output

    shown = await run_cli(api_url, "status", token=token)
    assert "no failures" in shown.output, shown.output
    acked = events(catalog, "acknowledged", job=job) + events(catalog, "acknowledged", job=other)
    assert len(acked) == 22 and {e["actor"] for e in acked} == {f"oncall-{job}"}, acked

    # Nothing left to acknowledge, and no filter at all: each says so and fails.
    again = await run_cli(api_url, "failures", "ack", "--reason", "lost on s3", token=token)
    assert again.exit_code == 1 and "nothing_to_acknowledge" in again.output, again.output
    bare = await run_cli(api_url, "failures", "ack", token=token)
    assert bare.exit_code == 1 and "say which failures" in bare.output, bare.output
