"""What every client command shares: `--token` before or after the subcommand, output fit for a
pipe or a log file (whole lines, no colour codes), and JSON where a value is JSON."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from sqlalchemy import Engine
from tierpoint_client import Checkpoint

from apps.cli.dev import dashboard_line
from apps.cli.render import checkpoint_detail
from apps.devstack.facts import S3Facts, StackInfo
from tests.helpers.cli import run_cli
from tests.helpers.tokens import create_token


async def test_token_works_after_the_subcommand_as_before_it(api_url: str, catalog: Engine) -> None:
    secret = create_token(catalog, scopes=("read",))
    for args in (("--token", secret, "status"), ("status", "--token", secret)):
        ran = await run_cli(api_url, *args)
        assert ran.exit_code == 0, ran.output
    # Used, not swallowed: a bad one after a subcommand of a group is refused by the API.
    bad = await run_cli(api_url, "checkpoints", "list", "any-job", "--token", "tp_" + "x" * 43)
    assert bad.exit_code == 1 and "401" in bad.output, bad.output


def _run_off_a_terminal(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


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
