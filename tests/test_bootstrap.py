"""bootstrap.py: the README's entry point on a machine with only python3."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bootstrap_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "bootstrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bootstrap.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.full_stack  # runs bootstrap.py as a process
def test_usage_without_a_command_exits_2() -> None:
    result = _run()
    assert result.returncode == 2
    assert "bootstrap.py dev" in result.stdout
    assert "bootstrap.py test" in result.stdout


@pytest.mark.full_stack  # runs bootstrap.py as a process
def test_help_exits_0() -> None:
    result = _run("--help")
    assert result.returncode == 0
    assert "bootstrap.py test" in result.stdout


@pytest.mark.full_stack  # runs bootstrap.py as a process
def test_other_commands_pass_through_to_tierpoint() -> None:
    result = _run("migrate", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: tierpoint migrate" in result.stdout


def test_static_checks_cover_every_package_of_the_project() -> None:
    bootstrap = _bootstrap_module()
    targets = bootstrap.mypy_targets()
    for package in (
        "tierpoint",
        "api",
        "activities",
        "workflows",
        "migrations",
        "tests",
        "examples",
    ):
        assert package in targets
    assert "bootstrap.py" in targets
    commands = [cmd for cmd, _cwd in bootstrap.lint_commands()]
    assert [Path(c[0]).name for c in commands[:3]] == ["ruff", "ruff", "mypy"]
    assert commands[1][1:] == ["format", "--check", "."]
