"""`tierpoint policy ...` against the real API served by uvicorn on a free local port."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import Engine

from tests.helpers.api import events, seed


@dataclass
class Result:
    exit_code: int
    output: str


async def _run(api_url: str, *args: str) -> Result:
    """The command in its own process, as an admin runs it."""
    env = {
        **os.environ,
        "TIERPOINT_API_URL": api_url,
        "TIERPOINT_ACTOR": "carol",
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tierpoint.cli.main",
        "policy",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode())


async def test_policy_commands(
    api_url: str,
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    new_policy: Callable[[], str],
    tmp_path: Path,
) -> None:
    name = new_policy()
    await seed(client, catalog, job, [1, 2, 3])
    doc = tmp_path / "policy.json"
    doc.write_text(json.dumps({"kinds": {"local": {"keep_last": 1}}}))

    r = await _run(api_url, "apply", name, str(doc))
    assert r.exit_code == 0, r.output
    assert "created" in r.output
    doc.write_text(json.dumps({"kinds": {"local": {"keep_last": 2}}}))
    r = await _run(api_url, "apply", name, str(doc))
    assert r.exit_code == 0 and "version 2" in r.output, r.output

    r = await _run(api_url, "assign", job, name)
    assert r.exit_code == 0 and f"{name} version 2 (job)" in r.output, r.output

    r = await _run(api_url, "list")
    assert r.exit_code == 0 and name in r.output, r.output
    r = await _run(api_url, "show", name)
    assert r.exit_code == 0 and '"keep_last": 2' in r.output and "revised" in r.output, r.output

    r = await _run(api_url, "plan", job, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)["plan"]
    assert [(e["tier"], e["step"]) for e in plan["expiries"]] == [("ssd", 1)]
    r = await _run(api_url, "plan", job)
    assert r.exit_code == 0 and "would expire now (1)" in r.output and "not_kept" in r.output

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kinds": {"local": {"keep_last": -1}}}))
    r = await _run(api_url, "apply", name, str(bad))
    assert r.exit_code == 1
    assert "invalid_policy" in r.output and "spec.kinds.local.keep_last" in r.output

    actors = {
        e["actor"] for e in events(catalog, "policy_changed") if e["detail"]["policy"] == name
    }
    assert actors == {"carol"}
