"""The benchmarks' rule, that a small shape of every scenario runs in CI: the smoke's groups
(tests/benchmarks/quick.py, a test module each) hold every scenario exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from benchmarks.scenarios import SCENARIOS
from tests.benchmarks import quick


def test_every_scenario_is_in_exactly_one_smoke_group() -> None:
    counts = Counter(name for group in quick.GROUPS.values() for name in group)
    assert set(counts) == set(SCENARIOS)
    assert {name for name, n in counts.items() if n > 1} == set()


def test_every_smoke_group_has_its_test_module() -> None:
    here = Path(__file__).parent
    for group in quick.GROUPS:
        module = (here / f"test_bench_quick_{group}.py").read_text()
        assert f'quick.GROUPS["{group}"]' in module, group
