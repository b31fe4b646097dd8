"""The operator's commands in their own processes against the real API (uvicorn on a free local
port) with real workers: `watch --until-idle` follows a throttled copy to its end, `status` shows
the job's recovery point, `show` its events, `checkpoints JOB` lists; `verify`, `retry`, `pin`
and `unpin` act (what `verify` read predicts a restore's time in `status`), and every `--json`
form parses."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import crc32c
import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, events, manifest, running_client, shard
from tests.helpers.cli import run_cli, run_status, serving
from tests.helpers.lifecycle import running_workers, shard_file
from tests.helpers.tokens import create_token
from tierpoint.config import Settings

MiB = 1024 * 1024
# Three 8 MiB chunks read off the node's ssd at 4 MiB/s (a POSIX copy reports a chunk once the
# next one is read, so the copy to lustre shows 8 MiB done before it ends): the seal and the copy
# take seconds each, and `watch` starts while the seal reads.
SIZE = 24 * MiB
READ_LIMIT = 4 * MiB
# Guards against a hang, not a performance assertion.
TIMEOUT = 180.0
ALL_RESTORABLE = {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}


@pytest.fixture
def throttled(settings: Settings) -> Settings:
    tiers = [
        t.model_copy(update={"read_bandwidth_limit": READ_LIMIT}) if t.name == "ssd" else t
        for t in settings.tiers
    ]
    return settings.model_copy(update={"tiers": tiers})


@pytest.fixture
async def stack(
    throttled: Settings, temporal: Client, nodes: tuple[str, str]
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """(URL of the served API, an admin client of the same catalog), with workers running."""
    async with running_workers(throttled, temporal), serving(create_app(throttled)) as url:
        async for c in running_client(create_app(throttled)):
            yield url, c


def write_shard(settings: Settings, job: str, step: int, path: str, data: bytes) -> dict[str, Any]:
    f = shard_file(settings, "ssd", NODE_A, job, step, path)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    return shard(path, size=len(data), crc=f"{crc32c.crc32c(data):08x}")


async def until_true(probe: Any, what: str) -> Any:
    async with asyncio.timeout(TIMEOUT):
        while True:
            found = await probe()
            if found:
                return found
            await asyncio.sleep(0.2)


async def states(c: httpx.AsyncClient, job: str, step: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def cli(url: str, token: str, *args: str) -> tuple[int, str]:
    r = await asyncio.wait_for(run_cli(url, *args, token=token), TIMEOUT)
    return r.exit_code, r.output


async def status_cli(url: str, token: str, *args: str) -> tuple[int, str]:
    r = await asyncio.wait_for(run_status(url, *args, token=token), TIMEOUT)
    return r.exit_code, r.output


async def in_a_terminal(url: str, token: str, *args: str) -> tuple[int, str]:
    """A `tierpoint` command whose stdout is a pseudo-terminal, as in an operator's shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIERPOINT_TOKEN", "NO_COLOR")}
    env |= {"TIERPOINT_API_URL": url, "TIERPOINT_TOKEN": token, "COLUMNS": "200", "TERM": "xterm"}
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apps.cli.main", *args, env=env, stdout=follower, stderr=follower
    )
    os.close(follower)

    def drain() -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        out = await asyncio.to_thread(drain)
        code = await proc.wait()
    finally:
        os.close(leader)
    return code, out.decode(errors="replace")


def parsed(out: str) -> Any:
    return json.loads(out)


def read_throughput(catalog: Engine) -> dict[str, float]:
    """Tier -> bytes per second of the reads the catalog recorded there."""
    with catalog.connect() as conn:
        rows = conn.execute(text("SELECT tier, bytes, seconds FROM tier_read_stats")).all()
    return {r.tier: r.bytes / r.seconds for r in rows}


async def test_watch_status_show_follow_a_throttled_copy(
    stack: tuple[str, httpx.AsyncClient], throttled: Settings, catalog: Engine, job: str
) -> None:
    url, c = stack
    token = create_token(catalog, scopes=["read", "operate"])
    body = manifest(1, [write_shard(throttled, job, 1, "model.bin", os.urandom(SIZE))])
    r = await c.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text

    async def lustre_in_flight() -> bool:
        r = await c.get("/v1/copies/in-flight", params={"job": job, "tier": "lustre"})
        return bool(r.json()["items"])

    await until_true(lustre_in_flight, "the copy to lustre to start")
    watch = ("watch", job, "--until-idle", "--interval", "0.5")
    # The same copies watched on a terminal (progress bars) and through a pipe (lines).
    (code, out), (tty_code, tty_out) = await asyncio.gather(
        cli(url, token, *watch), asyncio.wait_for(in_a_terminal(url, token, *watch), TIMEOUT)
    )
    assert tty_code == 0, tty_out
    assert f"{job} step 1 -> lustre" in tty_out and "━" in tty_out, tty_out
    assert "idle: nothing in flight" in tty_out, tty_out
    assert code == 0, out
    progress = re.findall(rf"{job} step 1 -> lustre  (\d+)% \((\d+)/{SIZE} bytes", out)
    # A copy whose bytes are all written is still in flight while it is read back and recorded,
    # so a line may show every byte before the one that says it is done.
    assert progress and all(int(done) <= SIZE for _, done in progress), out
    # It printed the copy's progress as it moved, not only its start and its end.
    assert any(0 < int(done) < SIZE for _, done in progress), out
    assert f"{job} step 1 -> lustre  done: restorable" in out, out
    assert f"{job} step 1 -> s3  done: restorable" in out, out
    assert out.rstrip().endswith("idle: nothing in flight"), out
    assert await states(c, job, 1) == ALL_RESTORABLE

    code, out = await status_cli(url, token)
    assert code == 0, out
    assert "API /healthz 200" in out and "API /readyz 200" in out, out
    row = next(line for line in out.splitlines() if line.startswith(f"│ {job}"))
    assert row.count("step 1") == 3, row  # its recovery point on every tier
    assert "nothing in flight" in out and "no failures" in out, out
    code, out = await status_cli(url, token, "--job", job, "--json")
    assert code == 0, out
    status = parsed(out)
    assert status["readyz"]["status"] == 200 and status["problems"] == []
    (overview,) = status["jobs"]["items"]
    assert [(p["tier"], p["latest_step"]) for p in overview["tiers"]] == [
        ("ssd", 1),
        ("lustre", 1),
        ("s3", 1),
    ]
    assert status["in_flight"]["items"] == [] and status["failures"]["items"] == []
    assert {t["tier"] for t in status["tiers_usage"]["items"]} == {"ssd", "lustre", "s3"}

    code, out = await cli(url, token, "show", job, "1")
    assert code == 0, out
    assert "registered" in out and "promoted" in out and "1 verified" in out, out
    code, out = await cli(url, token, "show", job, "1", "--json")
    assert code == 0, out
    shown = parsed(out)
    assert shown["checkpoint"]["step"] == 1
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds[0] == "registered" and kinds.count("promoted") == 3, kinds

    code, out = await cli(url, token, "checkpoints", job)
    assert code == 0 and f"checkpoints of {job}" in out, out
    code, out = await cli(url, token, "checkpoints", "list", job, "--json")
    assert code == 0, out
    assert [cp["step"] for cp in parsed(out)["items"]] == [1]


async def test_verify_retry_pin_unpin(
    stack: tuple[str, httpx.AsyncClient], throttled: Settings, catalog: Engine, job: str
) -> None:
    url, c = stack
    oncall = f"oncall-{job}"
    token = create_token(catalog, name=oncall, scopes=["read", "operate"])
    data = b"small and quick " * 100
    body = manifest(1, [write_shard(throttled, job, 1, "a.bin", data)])
    assert (await c.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201

    async def restorable() -> bool:
        return await states(c, job, 1) == ALL_RESTORABLE

    await until_true(restorable, "step 1 to be restorable everywhere")

    code, out = await cli(url, token, "verify", job, "1", "--tier", "lustre")
    assert code == 0, out
    assert "read 1, 1 good, 0 corrupt, 0 lost" in out, out
    code, out = await cli(url, token, "verify", job, "1", "--tier", "s3", "--json")
    assert code == 0, out
    v = parsed(out)
    assert v["status"] == "completed" and v["outcome"]["good"] == 1, v
    # The node-local copy is read on its node's queue.
    code, out = await cli(url, token, "verify", job, "1", "--tier", "ssd", "--json")
    assert code == 0 and parsed(out)["outcome"]["good"] == 1, out
    code, out = await cli(url, token, "verify", job, "1", "--tier", "tape")
    assert code == 1 and "unknown_tier" in out, out
    assert await states(c, job, 1) == ALL_RESTORABLE

    # What the three verifications read is each tier's read throughput: `status` predicts a
    # restore of step 1 from every tier, and nothing trained since it is at risk.
    speeds = read_throughput(catalog)
    code, out = await status_cli(url, token, "--job", job, "--json")
    assert code == 0, out
    (row,) = parsed(out)["jobs"]["items"]
    assert (row["steps_at_risk_durable"], row["steps_at_risk"]) == (0, 0), row
    predicted = {p["tier"]: p["predicted_restore_seconds"] for p in row["tiers"]}
    assert predicted == {t: pytest.approx(len(data) / speeds[t]) for t in ALL_RESTORABLE}, row
    code, out = await cli(url, token, "status", "--job", job)
    assert code == 0 and "steps at risk" in out, out
    line = next(line for line in out.splitlines() if line.startswith(f"│ {job}"))
    # "restore ~3s", or "restore <1s" for a small copy on a fast tier.
    assert "0 / 0" in line and line.count(", restore ") == 3, line

    code, out = await cli(url, token, "pin", job, "1")
    assert code == 0 and f"pinned {job} step 1" in out, out
    code, out = await cli(url, token, "pin", job, "1", "--json")
    assert code == 0 and parsed(out) == {"job": job, "step": 1, "pinned": True, "changed": False}
    code, out = await cli(url, token, "unpin", job, "1", "--json")
    assert code == 0 and parsed(out)["pinned"] is False, out
    code, out = await cli(url, token, "unpin", job, "1")
    assert code == 0 and "(it already was)" in out, out

    code, out = await cli(url, token, "retry", job, "1")
    assert code == 1 and "nothing_to_retry" in out, out
    # Registered before its file was written: fails everywhere, then a retry copies it.
    body = manifest(2, [shard("late.bin", size=len(data), crc=f"{crc32c.crc32c(data):08x}")])
    assert (await c.post(f"/v1/jobs/{job}/checkpoints", json=body)).status_code == 201

    async def failed() -> bool:
        return set((await states(c, job, 2)).values()) == {"failed"}

    await until_true(failed, "step 2 to fail")
    write_shard(throttled, job, 2, "late.bin", data)
    code, out = await cli(url, token, "retry", job, "2", "--json")
    assert code == 0, out
    assert parsed(out)["tiers"] == ["lustre", "s3", "ssd"]

    async def retried() -> bool:
        return await states(c, job, 2) == ALL_RESTORABLE

    await until_true(retried, "step 2 to be restorable after the retry")
    # Recorded with the token's name as the actor: three verifications and the retry.
    recorded = events(catalog, "operator_action", job=job)
    assert sorted(e["detail"]["action"] for e in recorded) == ["retry", *["verify"] * 3]
    assert {e["actor"] for e in recorded} == {oncall}
