"""The benchmark smoke's "trainers" group (tests/benchmarks/quick.py): torchtitan's save and
load through tierpoint:// against its local folder, at its debug model's size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks import quick

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack


@pytest.mark.slow
def test_quick_run_measures_each_scenario_against_its_baseline(tmp_path: Path) -> None:
    quick.run(quick.GROUPS["trainers"], tmp_path)
