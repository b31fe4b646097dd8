"""A fleet's work dir holds every process's log, Temporal's database and the catalog's data: what
a slow or failed run is read from afterwards. `--keep` keeps it; else it goes with the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fleet import Fleet


@pytest.mark.parametrize("keep", [True, False])
def test_a_fleet_leaves_its_work_dir_only_when_kept(tmp_path: Path, keep: bool) -> None:
    work = tmp_path / "scale"
    work.mkdir()
    (work / "node-workers-1.log").write_text("a worker's log\n")
    Fleet(work, keep=keep).close()
    assert (work / "node-workers-1.log").exists() is keep
