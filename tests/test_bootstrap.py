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


def test_fast_runs_the_pure_and_catalog_tiers_on_two_workers() -> None:
    bootstrap = _bootstrap_module()
    command = bootstrap.pytest_command(["--fast"])
    assert command[1:] == [
        *("-m", "pure or catalog", "--hypothesis-profile", "fast"),
        *("-n", "2", "--dist", "worksteal"),
    ]


def test_the_whole_suite_keeps_whole_modules_on_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tier marks select nothing out of a plain run: it runs every test, as before."""
    monkeypatch.delenv("TIERPOINT_TEST_WORKERS", raising=False)
    bootstrap = _bootstrap_module()
    assert bootstrap.pytest_command([])[1:] == [
        "-n",
        "3",
        "--dist",
        "loadfile",
        "--max-worker-restart=0",
    ]
    assert bootstrap.pytest_command(["--no-lint"])[1:] == [
        "-n",
        "3",
        "--dist",
        "loadfile",
        "--max-worker-restart=0",
    ]


def test_a_selection_keeps_the_workers_and_named_tests_run_in_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TIERPOINT_TEST_WORKERS", raising=False)
    bootstrap = _bootstrap_module()
    # The value of -m or -k names no test.
    assert bootstrap.pytest_command(["-m", "catalog"])[1:] == [
        *("-n", "3", "--dist", "loadfile", "--max-worker-restart=0"),
        *("-m", "catalog"),
    ]
    assert bootstrap.pytest_command(["tests/test_tiers.py", "-x"])[1:] == [
        "tests/test_tiers.py",
        "-x",
    ]
    assert bootstrap.pytest_command(["--fast", "tests/tierpoint", "-n", "0"])[1:] == [
        *("-m", "pure or catalog", "--hypothesis-profile", "fast"),
        *("tests/tierpoint", "-n", "0"),
    ]


def test_the_tests_write_bytecode_where_the_shell_says_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Else every worker of every run compiles the project and the tests again."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("TIERPOINT_SOMETHING", "kept")
    env = _bootstrap_module().test_env()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["TIERPOINT_SOMETHING"] == "kept"
