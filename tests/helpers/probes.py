"""pytest run as a developer runs it, on probe tests written by a test: with the suite's own
conftest and configuration, in a process of its own (tests of the test infrastructure itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# pytest_plugins in the probe directory's conftest would do the same, but only a rootdir conftest
# may use it: `-p` loads the suite's conftest as a plugin, with its fixtures and hooks.
CONFIG = str(ROOT / "pyproject.toml")
PYTEST = [sys.executable, "-m", "pytest", "-c", CONFIG, "-p", "tests.conftest"]


def write_probe(tmp_path: Path, source: str) -> tuple[Path, Path]:
    """The probe module holding `source`, and an empty folder for what its tests leave (the
    environment's PROBE_OUT)."""
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(source)
    out = tmp_path / "out"
    out.mkdir()
    return probe, out


def run_pytest(probe: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROBE_OUT": str(out)}
    return subprocess.run(
        [*PYTEST, "-p", "no:cacheprovider", "-q", *args, str(probe)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def outcomes(report: str) -> dict[str, str]:
    """Each test's outcome (PASSED, FAILED, ERROR) read off a run with `-rA`."""
    return {
        line.split("::", 1)[1].split(" ", 1)[0]: line.split(" ", 1)[0]
        for line in report.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
