"""`tierpoint --help`, and the help of every command, as a user reads it on an 80-column terminal
and in a wide one: every help text as the source writes it (no bracket taken for markup, no
sentence broken where a docstring's line ends), nothing cut short, no value type on a flag; and
`tierpoint --version`. The README's command table lists every command."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import typer

from apps.cli.main import app

ROOT = Path(__file__).resolve().parents[3]
# Every command's help, rendered by the real CLI in one process (one per width): typer's help
# exits with SystemExit, which standalone_mode=False turns into a return.
RENDER = r"""
import contextlib, io, json, sys
from apps.cli.main import app
paths = json.loads(sys.argv[1])
out = {}
for path in paths:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        app([*path, "--help"], prog_name="tierpoint", standalone_mode=False)
    out[" ".join(path)] = buf.getvalue()
print(json.dumps(out))
"""
BOX = re.compile(r"[│╭╮╰╯─]")


def _texts(instance: typer.Typer, path: list[str]) -> Iterator[tuple[list[str], str]]:
    """(command path, a help text as written in the source) of every command under `instance`:
    docstrings and the help of every option and argument."""
    callbacks = (
        [(path, instance.registered_callback.callback)] if instance.registered_callback else []
    )
    if instance.info.help:
        yield path, str(instance.info.help)
    for command in instance.registered_commands:
        assert command.callback is not None
        callbacks.append(([*path, command.name or command.callback.__name__], command.callback))
    for at, callback in callbacks:
        if callback is None:
            continue
        if at != path or not instance.info.help:
            yield at, inspect.getdoc(callback) or ""
        for hint in get_type_hints(callback, include_extras=True).values():
            for meta in getattr(hint, "__metadata__", ()):
                if getattr(meta, "help", None):
                    yield at, meta.help
    for group in instance.registered_groups:
        assert group.typer_instance is not None and group.name is not None
        yield from _texts(group.typer_instance, [*path, group.name])


def _paths() -> list[list[str]]:
    found = {tuple(p) for p, _ in _texts(app, [])}
    return [list(p) for p in sorted(found, key=lambda p: (len(p), p))]


def _render(columns: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPOINT_", "TERMINAL_"))}
    env |= {"COLUMNS": str(columns), "NO_COLOR": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", RENDER, json.dumps([list(p) for p in _paths()])],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    rendered: dict[str, str] = json.loads(ran.stdout)
    return rendered


def _lines(help_text: str) -> list[str]:
    return [" ".join(BOX.sub(" ", line).split()) for line in help_text.splitlines()]


@pytest.mark.full_stack  # runs `tierpoint --help` as a process
def test_every_help_text_shows_as_written_one_paragraph_per_line() -> None:
    """Wide enough for any paragraph: each one is on one line, word for word, brackets and
    backticks included (rich markup ate `[[tiers]]`; docstrings broke sentences mid-line)."""
    rendered = _render(1000)
    assert set(rendered) == {" ".join(p) for p in _paths()}
    missing = []
    for path, text in _texts(app, []):
        lines = _lines(rendered[" ".join(path)])
        for paragraph in inspect.cleandoc(text).split("\n\n"):
            want = " ".join(paragraph.split())
            if want and not any(want in line for line in lines):
                missing.append((" ".join(path), want))
    assert missing == [], "\n".join(f"tierpoint {p} --help lacks: {w}" for p, w in missing)


@pytest.mark.full_stack  # runs `tierpoint --help` as a process
def test_on_80_columns_nothing_is_cut_and_no_flag_shows_a_type() -> None:
    rendered = _render(80)
    for path, shown in rendered.items():
        assert "…" not in shown, f"tierpoint {path} --help cuts a value:\n{shown}"
        assert "<bool>" not in shown, f"tierpoint {path} --help gives a flag a type:\n{shown}"
        assert max(len(line) for line in shown.splitlines()) <= 80, shown


@pytest.mark.full_stack  # runs `tierpoint --help` as a process
def test_defaults_named_after_a_setting_are_that_settings_defaults() -> None:
    from tierpoint.config import Settings

    shown = "\n".join(_render(1000).values())
    named = re.findall(r"setting (\w+): ([^)\]]+)\)", shown)
    assert named, shown
    for name, value in named:
        default: Any = Settings.model_fields[name].default
        assert value == ("none" if default is None else str(default)), (name, value)


@pytest.mark.full_stack  # runs `tierpoint --version` as a process
def test_version_is_the_installed_packages() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"tierpoint {version('tierpoint')}\n"


def test_the_readmes_command_table_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `tierpoint ([a-z-]+)", table, re.M))
    listed |= set(re.findall(r"/ `(?:tierpoint )?([a-z-]+) [A-Z]", table))
    commands = {p[0] for p in _paths() if p}
    assert commands - listed == set(), f"README's command table lacks {commands - listed}"
