"""`kill -9` of `tierpoint dev`: its servers do not outlive it, and the next `tierpoint dev` on
the same data dir finds what is left, stops it, and runs the only servers on that data dir. While
a stack runs, a second one on its data dir refuses and names it. Real processes, real SIGKILL."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from tests.apps.devstack.test_dev_stack_e2e import (
    DevProcess,
    _alive,
    _cli,
    _env,
    _tail,
    start_dev,
)

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

GONE_TIMEOUT = 60.0  # a hang guard: a server that outlives its stack never goes


def _servers(dev: DevProcess) -> dict[str, int]:
    """The stack's Temporal, moto and API (its children) and Postgres (daemonized by pg_ctl)."""
    found: dict[str, int] = {}
    for child in psutil.Process(dev.proc.pid).children(recursive=True):
        cmdline = " ".join(child.cmdline())
        if "start-dev" in cmdline:
            found["temporal"] = child.pid
        elif "moto_server" in cmdline:
            found["moto"] = child.pid
        elif "apps.devstack.api_process" in cmdline:
            found["api"] = child.pid
    found["postgres"] = _postmaster(dev.data_dir)
    assert set(found) == {"temporal", "moto", "api", "postgres"}, found
    return found


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])


def _temporal_servers_on(db: Path) -> list[int]:
    servers = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "start-dev" in cmdline and str(db) in cmdline:
            servers.append(proc.pid)
    return servers


def _wait_gone(pids: set[int], log: Path) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT
    while {p for p in pids if _alive(p)}:
        if time.monotonic() > deadline:
            left = {p for p in pids if _alive(p)}
            # Not left running for the rest of the suite (or the machine) once reported.
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"still running after the stack was killed: {left}\n{_tail(log)}")
        time.sleep(0.2)


@pytest.fixture
def root() -> Iterator[Path]:
    made = Path(tempfile.mkdtemp(prefix="tierpoint-killed-"))
    made.chmod(0o755)  # the embedded Postgres runs as its own user when we are root
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_sigkill_leaves_no_server_and_a_restart_stops_the_postgres_it_left(root: Path) -> None:
    dev = start_dev(root / "dev", root / "dev-1.log")
    try:
        left = _servers(dev)
    finally:
        os.kill(dev.proc.pid, signal.SIGKILL)
        dev.proc.wait()
    # Temporal, moto and the API die with the stack that started them (the API's port is free
    # for the next stack).
    _wait_gone({left["temporal"], left["moto"], left["api"]}, dev.log)

    # A kill -9 leaves the stack's facts behind: wait for the new stack's.
    again = start_dev(dev.data_dir, root / "dev-2.log", stale=dev.info)
    try:
        # The Postgres that pg_ctl daemonized outlived the stack: the restart stopped it and
        # started its own, and said so.
        assert not _alive(left["postgres"]), _tail(again.log)
        now = _servers(again)
        assert now["postgres"] != left["postgres"]
        assert f"postgres (pid {left['postgres']})" in again.log.read_text(), _tail(again.log)
        assert _temporal_servers_on(dev.data_dir.resolve() / "temporal.db") == [now["temporal"]]
        with again.api() as api:
            assert api.get("/v1/tiers").status_code == 200
    finally:
        owned = again.owned_pids()
        assert again.interrupt() == 0, _tail(again.log)
    # Ctrl-C of the restarted stack stops everything, the Postgres it started included.
    assert {p for p in owned if _alive(p)} == set()


def test_a_second_stack_on_a_live_stacks_data_dir_refuses_naming_it(root: Path) -> None:
    dev = start_dev(root / "dev", root / "dev-1.log")
    try:
        servers = _servers(dev)
        # As a user runs it twice: the same port (both on the default 8080), and any free one.
        port = str(urlsplit(dev.info.api_url).port)
        for second_port in (port, "0"):
            second = subprocess.run(
                _cli("dev", "--data-dir", str(dev.data_dir), "--port", second_port),
                capture_output=True,
                text=True,
                env=_env(),
                timeout=120,
            )
            assert second.returncode == 1, second.stdout + second.stderr
            refusal = " ".join(second.stderr.split())
            assert f"pid {dev.proc.pid}" in refusal, refusal
            assert f"postgres pid {servers['postgres']}" in refusal, refusal
        # It stopped nothing of the live stack's.
        assert all(_alive(pid) for pid in servers.values()), servers
        with dev.api() as api:
            assert api.get("/v1/tiers").status_code == 200
    finally:
        assert dev.interrupt() == 0, _tail(dev.log)
