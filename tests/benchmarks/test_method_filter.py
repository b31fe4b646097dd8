"""`python -m benchmarks --method TEXT`: only the named methods run, with every method their rows
are compared to (so each ratio still has its baseline in the same run)."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import parse_args, selected
from benchmarks.harness import Method, Outcome, Row


def method(name: str, baseline: str | None = None) -> Method:
    return Method(name, lambda: Outcome({}), (Row(name, baseline=baseline),))


METHODS = [
    method("S3StorageReader"),
    method("TierpointReader from S3", baseline="S3StorageReader"),
    method("FileSystemReader"),
    method("TierpointReader from the local tier", baseline="FileSystemReader"),
    method("chained", baseline="TierpointReader from S3"),
]


def names(methods: list[Method]) -> list[str]:
    return [m.name for m in methods]


def test_without_a_filter_every_method_runs() -> None:
    assert selected(METHODS, None) == METHODS


def test_a_method_brings_its_baseline_in_the_scenarios_order() -> None:
    assert names(selected(METHODS, ["from S3"])) == ["S3StorageReader", "TierpointReader from S3"]


def test_baselines_are_followed_through_a_chain() -> None:
    assert names(selected(METHODS, ["chained"])) == [
        "S3StorageReader",
        "TierpointReader from S3",
        "chained",
    ]


def test_a_filter_that_names_nothing_is_an_error() -> None:
    with pytest.raises(SystemExit, match="no method"):
        selected(METHODS, ["nothing like it"])


def test_the_option_is_repeatable() -> None:
    args = parse_args(["--method", "a", "--method", "b"])
    assert args.method == ["a", "b"]
