"""`tierpoint policy ...` against the real API served by uvicorn on a free local port."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import Engine

from tests.helpers.api import events, seed
from tests.helpers.cli import Result, run_cli
from tests.helpers.tokens import create_token


async def _run(api_url: str, token: str, *args: str) -> Result:
    """A `tierpoint policy` command in its own process, with `token`."""
    return await run_cli(api_url, "policy", *args, token=token)


async def test_policy_commands(
    api_url: str,
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    new_policy: Callable[[], str],
    tmp_path: Path,
) -> None:
    name = new_policy()
    carol = create_token(catalog, "carol")
    await seed(client, catalog, job, [1, 2, 3])
    doc = tmp_path / "policy.json"
    doc.write_text(json.dumps({"kinds": {"local": {"keep_last": 1}}}))

    r = await _run(api_url, carol, "apply", name, str(doc))
    assert r.exit_code == 0, r.output
    assert "created" in r.output
    doc.write_text(json.dumps({"kinds": {"local": {"keep_last": 2}}}))
    r = await _run(api_url, carol, "apply", name, str(doc))
    assert r.exit_code == 0 and "version 2" in r.output, r.output

    r = await _run(api_url, carol, "assign", job, name)
    assert r.exit_code == 0 and f"{name} version 2 (job)" in r.output, r.output

    r = await _run(api_url, carol, "list")
    assert r.exit_code == 0 and name in r.output, r.output
    r = await _run(api_url, carol, "show", name)
    assert r.exit_code == 0 and '"keep_last": 2' in r.output and "revised" in r.output, r.output
    r = await _run(api_url, carol, "list", "--json")
    assert r.exit_code == 0 and name in [p["name"] for p in json.loads(r.output)["items"]]
    r = await _run(api_url, carol, "show", name, "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    assert shown["policy"]["version"] == 2 and len(shown["history"]) >= 2, shown

    r = await _run(api_url, carol, "plan", job, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)["plan"]
    assert [(e["tier"], e["step"]) for e in plan["expiries"]] == [("ssd", 1)]
    r = await _run(api_url, carol, "plan", job)
    assert r.exit_code == 0 and "would expire now (1)" in r.output and "not_kept" in r.output

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kinds": {"local": {"keep_last": -1}}}))
    r = await _run(api_url, carol, "apply", name, str(bad))
    assert r.exit_code == 1
    assert "invalid_policy" in r.output and "spec.kinds.local.keep_last" in r.output

    actors = {
        e["actor"] for e in events(catalog, "policy_changed") if e["detail"]["policy"] == name
    }
    assert actors == {"carol"}


async def _run_bare(api_url: str, *args: str) -> Result:
    """A CLI command with no token in its environment."""
    return await run_cli(api_url, *args)


async def test_the_token_comes_from_the_flag_and_its_scope_counts(
    api_url: str, catalog: Engine, new_policy: Callable[[], str], tmp_path: Path
) -> None:
    reader = create_token(catalog, f"reader-{new_policy()}", ["read"])
    r = await _run_bare(api_url, "policy", "list")
    assert r.exit_code == 1 and "missing_token" in r.output and "TIERPOINT_TOKEN" in r.output
    r = await _run_bare(api_url, "--token", reader, "policy", "list")
    assert r.exit_code == 0, r.output
    doc = tmp_path / "policy.json"
    doc.write_text(json.dumps({"kinds": {"local": {"keep_last": 1}}}))
    r = await _run_bare(api_url, "--token", reader, "policy", "apply", new_policy(), str(doc))
    assert r.exit_code == 1 and "insufficient_scope" in r.output, r.output
    assert reader not in r.output
