"""The embedded servers start on their own port even when another process holds the one chosen for
them: a port from free_port() is free only at that moment, and the Temporal dev server itself
listens on four ports it picks. Before, a moto whose port Temporal had taken exited, while the
start went on talking HTTP to Temporal's gRPC port until it gave up with a connection reset."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.devstack import services
from apps.devstack.services import (
    ExitedWhileStarting,
    MotoS3Server,
    TemporalDevServer,
    listens,
)

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another listener holds for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _first_choice_taken(monkeypatch: pytest.MonkeyPatch, taken: int) -> list[int]:
    """free_port() answers `taken` first, as if another process bound it since it was chosen."""
    chosen: list[int] = []
    real = services.free_port

    def choose() -> int:
        port = taken if not chosen else real()
        chosen.append(port)
        return port

    monkeypatch.setattr(services, "free_port", choose)
    return chosen


def test_listens_names_the_process_that_holds_the_port(held_port: int) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert listens(child.pid, port)
        # The port answers, but not from that process.
        assert not listens(child.pid, held_port)
    finally:
        child.kill()
        child.wait()
    assert not listens(child.pid, port)  # gone


def test_moto_on_a_given_port_that_is_taken_fails_at_once(held_port: int) -> None:
    moto = MotoS3Server(port=held_port)
    with pytest.raises(ExitedWhileStarting, match="moto S3 server exited"):
        moto.start()
    assert moto.port == held_port  # a port the caller gave is never changed


def test_moto_starts_again_on_a_new_port_when_its_port_was_taken(
    held_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = _first_choice_taken(monkeypatch, held_port)
    moto = MotoS3Server()
    try:
        url = moto.start(log_file=tmp_path / "moto.log")
        assert chosen[0] == held_port and moto.port == chosen[-1] != held_port
        assert url == f"http://127.0.0.1:{moto.port}"
        assert moto.pid is not None and listens(moto.pid, moto.port)
    finally:
        moto.stop()


def test_temporal_starts_again_on_new_ports_when_its_port_was_taken(
    held_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = _first_choice_taken(monkeypatch, held_port)
    temporal = TemporalDevServer(tmp_path / "temporal.db", ui_port=0)
    try:
        address = temporal.start(log_file=tmp_path / "temporal.log")
        assert chosen[0] == held_port and temporal.port not in (0, held_port)
        assert address == f"127.0.0.1:{temporal.port}"
        assert temporal.ui_port not in (None, 0, held_port)
        assert temporal.pid is not None and listens(temporal.pid, temporal.port)
    finally:
        temporal.stop()
