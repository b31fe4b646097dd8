"""Scratch directories (a rebuild's fetched stripes) in real processes: one whose process was
killed (SIGKILL) is reclaimed by the next attempt; one a live process holds is never touched,
and its process removes it when done; an area planted as a symlink is not used (nothing under
its target touched) and stops nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.worker_process import REPO
from tierpoint.storage.posix.scratch import scratch_dir

AREA = "tierpoint-test-scratch"
# A process that takes a scratch directory, writes into it, says where, and waits for a line on
# its stdin before it leaves.
_HOLDER = """
import sys
from tierpoint.storage.posix.scratch import scratch_dir
with scratch_dir(sys.argv[1]) as d:
    (d / "fetched").write_bytes(b"x" * 65536)
    print(d, flush=True)
    sys.stdin.readline()
"""


def _holding(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, AREA],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    held = Path(proc.stdout.readline().strip())
    assert (held / "fetched").is_file(), proc.returncode
    return proc, held


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temp directory, and its children's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.full_stack
def test_a_killed_attempts_scratch_is_reclaimed_by_the_next_and_a_live_ones_is_not(
    tmp: Path,
) -> None:
    killed, left = _holding(tmp)
    live, held = _holding(tmp)
    try:
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert (left / "fetched").is_file()
        with scratch_dir(AREA) as mine:
            assert mine.is_dir() and not any(mine.iterdir())
            assert not left.exists()
            # The live process's directory and bytes are as it left them.
            assert (held / "fetched").read_bytes() == b"x" * 65536
        assert not mine.exists()
    finally:
        assert live.stdin is not None
        live.stdin.write("done\n")
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert not held.exists()
    assert list((tmp / AREA).iterdir()) == []


def test_an_area_planted_as_a_symlink_is_not_used_and_stops_nothing(tmp: Path) -> None:
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "attempt-victim").mkdir()
    (tmp / AREA).symlink_to(elsewhere)
    with scratch_dir(AREA) as mine:
        assert mine.is_dir() and not any(mine.iterdir())
        assert mine.resolve().parent == tmp.resolve()
    assert not mine.exists()
    # Nothing under the link's target was reclaimed, nor anything made there.
    assert [p.name for p in elsewhere.iterdir()] == ["attempt-victim"]
