"""A wrong or missing token, as a user meets it: every client command fails (exit 1) with one
line that says the API refused the token, its stable code, and what to do, whichever way the
command talks to the API (the client library, the CLI's own HTTP calls, the operator views of
`status`). Each command runs in its own process against the real API."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

WRONG = "tp_" + "x" * 43
# What the line says to do about it.
HINT = "pass --token, set TIERPOINT_TOKEN, or use a dev stack's --data-dir"
# Commands of each way to the API: the client library (checkpoints, restore, quarantine), the
# CLI's HTTP client (show, policy, usage, nodes, watch, reconcile, verify) and the views of status.
COMMANDS = [
    ("status",),
    ("status", "--json"),
    ("checkpoints", "list", "some-job"),
    ("show", "some-job", "100"),
    ("policy", "list"),
    ("usage", "some-job"),
    ("nodes",),
    ("failures", "list"),
    ("failures", "ack", "some-job"),
    ("watch", "--until-idle"),
    ("reconcile",),
    ("verify", "some-job", "100"),
    ("quarantine", "some-job", "100", "--reason", "NaN after load"),
    ("restore", "some-job", "{tmp}/restored"),
]


@pytest.mark.parametrize(
    ("token", "code"), [(WRONG, "invalid_token"), (None, "missing_token")], ids=["wrong", "none"]
)
async def test_a_refused_token_fails_every_command_in_one_line(
    api_url: str, token: str | None, code: str, tmp_path: Path
) -> None:
    for command in COMMANDS:
        args = [a.format(tmp=tmp_path) for a in command]
        ran = await run_cli(api_url, *args, token=token, stderr_apart=True)
        shown = f"$ tierpoint {' '.join(args)}\nstdout:\n{ran.output}\nstderr:\n{ran.stderr}"
        assert ran.exit_code == 1, shown
        lines = [line for line in ran.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, shown
        assert f"(401 {code})" in lines[0] and HINT in lines[0], shown
        assert ran.output.strip() == "", shown
    assert not (tmp_path / "restored").exists()
