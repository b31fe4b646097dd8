"""What every client command shares: `--token`, `--data-dir` and `--api-url` before or after the
subcommand, output fit for a pipe or a log file (whole lines, no colour codes), and JSON where a
value is JSON."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from sqlalchemy import Engine
from tierpoint_client import Checkpoint

from apps.cli.dev import dashboard_line
from apps.cli.render import checkpoint_detail
from apps.devstack.facts import S3Facts, StackInfo
from tests.helpers.api import seed
from tests.helpers.cli import run_cli, until_ready
from tests.helpers.tokens import create_token


async def test_token_works_after_the_subcommand_as_before_it(api_url: str, catalog: Engine) -> None:
    secret = create_token(catalog, scopes=("read",))
    for args in (("--token", secret, "status"), ("status", "--token", secret)):
        ran = await until_ready(functools.partial(run_cli, api_url, *args))
        assert ran.exit_code == 0, ran.output
    # Used, not swallowed: a bad one after a subcommand of a group is refused by the API.
    bad = await run_cli(api_url, "checkpoints", "list", "any-job", "--token", "tp_" + "x" * 43)
    assert bad.exit_code == 1 and "401" in bad.output, bad.output


def _tierpoint(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tierpoint ARGS` in a new shell: no TIERPOINT_* settings but `env`'s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERPOINT_")}
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", *args],
        capture_output=True,
        text=True,
        env=clean | {"COLUMNS": "200", "NO_COLOR": "1"} | (env or {}),
        timeout=120,
    )


async def test_data_dir_and_api_url_work_before_the_subcommand_as_after_it(
    api_url: str, client: httpx.AsyncClient, catalog: Engine, job: str, tmp_path: Path
) -> None:
    """As a user points the CLI at a dev stack in another terminal: its data dir (whose
    stack.json names the API and a token), or the API's URL and a token, before the subcommand
    or after it; a flag wins over the environment, and one after the subcommand over one
    before it. A command that takes none of it refuses it."""
    await seed(client, catalog, job, [100])
    secret = create_token(catalog, scopes=("read",))
    stack = tmp_path / "peer-dev"
    stack.mkdir()
    s3 = S3Facts("http://127.0.0.1:9", "b", "us-east-1", "k", "s")
    facts = StackInfo(api_url, secret, {"node-a": str(tmp_path / "ssd")}, None, s3)
    (stack / "stack.json").write_text(json.dumps(facts.to_json()))
    nowhere = str(tmp_path / "no-stack-here")
    runs = [
        _tierpoint("--data-dir", str(stack), "checkpoints", "list", job),
        _tierpoint("--data-dir", str(stack), "checkpoints", job),
        _tierpoint("checkpoints", "list", job, "--data-dir", str(stack)),
        _tierpoint("--data-dir", str(stack), "show", job, "100"),
        _tierpoint("--data-dir", nowhere, "show", job, "100", "--data-dir", str(stack)),
        _tierpoint("--data-dir", str(stack), "status", env={"TIERPOINT_DATA_DIR": nowhere}),
        _tierpoint("--api-url", api_url, "--token", secret, "checkpoints", job),
        _tierpoint("--api-url", api_url, "show", job, "100", env={"TIERPOINT_TOKEN": secret}),
    ]
    for ran in runs:
        shown = f"$ tierpoint {' '.join(ran.args[3:])}\n{ran.stdout}{ran.stderr}"
        assert ran.returncode == 0, shown
        assert job in ran.stdout, shown
    refused = _tierpoint("--api-url", api_url, "dev", "--data-dir", str(tmp_path / "dev"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "`tierpoint dev` takes no --api-url" in refused.stderr, refused.stderr
    assert not (tmp_path / "dev").exists()


def _run_off_a_terminal(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.full_stack  # runs the CLI as a process, off a terminal
def test_off_a_terminal_a_table_row_stays_on_one_line() -> None:
    long_name = "llama-70b.pretrain.run-" + "7" * 90
    code = (
        "from rich.table import Table\n"
        "from apps.cli.context import console\n"
        "t = Table('job', 'latest', 'restorable on')\n"
        f"t.add_row({long_name!r}, '1000', 'ssd lustre s3')\n"
        "console.print(t)\n"
    )
    out = _run_off_a_terminal(code)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if long_name in line)
    assert "1000" in row and "ssd lustre s3" in row, out.stdout


@pytest.mark.full_stack  # runs the CLI as a process, off a terminal
def test_logs_off_a_terminal_have_no_colour_codes() -> None:
    code = (
        "from tierpoint import logs\n"
        "logs.configure('INFO')\n"
        "logs.get('first-day').warning('verify found a bad replica', tier='s3')\n"
    )
    out = _run_off_a_terminal(code)
    assert out.returncode == 0, out.stderr
    assert "verify found a bad replica" in out.stderr
    assert "\x1b[" not in out.stderr, repr(out.stderr)


def test_checkpoint_metadata_prints_as_json() -> None:
    metadata = {"loss": 1.73, "tokens_seen": 2**40, "note": "warm-up done", "ok": True}
    cp = Checkpoint.from_json(
        {
            "job": "j",
            "step": 100,
            "created_at": None,
            "metadata": metadata,
            "pinned": False,
            "quarantine_reason": None,
            "total_bytes": 10,
            "shard_count": 1,
            "tiers": [],
        }
    )
    out = io.StringIO()
    Console(file=out, width=400).print(checkpoint_detail(cp))
    line = next(x for x in out.getvalue().splitlines() if x.startswith("metadata: "))
    assert json.loads(line.removeprefix("metadata: ")) == metadata


def test_dev_prints_a_signed_in_dashboard_link_on_a_terminal_only(tmp_path: Path) -> None:
    token = "tp_" + "a" * 43
    s3 = S3Facts("http://127.0.0.1:9", "b", "us-east-1", "k", "s")
    info = StackInfo("http://127.0.0.1:8080", token, {}, str(tmp_path), s3)
    assert dashboard_line(info, tmp_path / "stack.env", on_terminal=True) == (
        f"dashboard: http://127.0.0.1:8080/#token={token}"
    )
    in_a_file = dashboard_line(info, tmp_path / "stack.env", on_terminal=False)
    assert token not in in_a_file
    assert in_a_file.startswith("dashboard: http://127.0.0.1:8080/#token=$TIERPOINT_TOKEN")
