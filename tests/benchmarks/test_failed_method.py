"""A benchmark method that fails is reported as failed beside the other methods' numbers, and the
run goes on to its other methods, rounds and scenarios; the run's status then says so."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import __main__ as bench
from benchmarks.env import Env
from benchmarks.harness import (
    Method,
    Outcome,
    Row,
    Scenario,
    any_failed,
    markdown,
    render,
    run_methods,
    summarize,
)
from benchmarks.scenarios import SCENARIOS, Sizes


class CatalogGone(RuntimeError):
    pass


def _raises() -> Outcome:
    raise CatalogGone("503 catalog_unavailable after 5 retries\ntraceback lines")


class Storm(Scenario):
    """A working method, one that always fails and is compared to it, and one compared to the
    failing one."""

    name = "storm"
    summary = "a restart storm"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def prepare(self) -> list[Method]:
        def ok() -> Outcome:
            self.ran.append("ok")
            return Outcome({"seconds": 2.0})

        def failing() -> Outcome:
            self.ran.append("failing")
            return _raises()

        return [
            Method("coordinator", ok, (Row("coordinator"),)),
            Method("per-rank", failing, (Row("per-rank", baseline="coordinator"),)),
            Method("after", ok, (Row("after", baseline="per-rank"),)),
        ]


class Unprepared(Scenario):
    name = "unprepared"
    summary = "a scenario whose services never came up"

    def prepare(self) -> list[Method]:
        raise CatalogGone("the embedded Postgres did not start")


def test_a_failing_method_is_reported_beside_the_others_numbers() -> None:
    scenario = Storm()
    methods = scenario.prepare()
    runs = run_methods(methods, 2, dict)
    # Every method ran in every round, the failing one too.
    assert sorted(scenario.ran) == ["failing"] * 2 + ["ok"] * 4
    result = summarize(scenario, methods, runs)
    rows = {r["label"]: r for r in result["rows"]}
    assert rows["coordinator"]["median"] == 2.0 and rows["coordinator"]["failed"] is None
    failed = rows["per-rank"]
    assert failed["median"] is None and failed["values"] == [] and failed["ratio"] is None
    assert failed["failed"] == (
        "2 of 2 runs failed: CatalogGone: 503 catalog_unavailable after 5 retries"
    )
    # Compared to a failed row: a number but no ratio.
    assert rows["after"]["median"] == 2.0 and rows["after"]["ratio"] is None
    assert any_failed({"storm": result})

    console = Console(file=io.StringIO(), width=300)
    render({"storm": result}, console)
    table = console.file.getvalue()  # type: ignore[attr-defined]
    assert "2 of 2 runs failed: CatalogGone: 503 catalog_unavailable" in table
    assert "2.00 s" in table
    assert "| per-rank | failed | failed | failed | 0 |" in markdown({"storm": result})


def test_a_run_that_fails_once_keeps_the_numbers_of_the_others() -> None:
    outcomes = iter([None, Outcome({"seconds": 1.0}), Outcome({"seconds": 3.0})])

    def flaky() -> Outcome:
        outcome = next(outcomes)
        return _raises() if outcome is None else outcome

    method = Method("flaky", flaky, (Row("flaky"),))
    scenario = Storm()
    (row,) = summarize(scenario, [method], run_methods([method], 3, dict))["rows"]
    assert row["values"] == [1.0, 3.0] and row["median"] == 2.0
    assert row["failed"].startswith("1 of 3 runs failed: CatalogGone")


def test_the_run_reports_every_scenario_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def storm(env: Env, sizes: Sizes) -> Scenario:
        return Storm()

    def unprepared(env: Env, sizes: Sizes) -> Scenario:
        return Unprepared()

    monkeypatch.setitem(SCENARIOS, "unprepared", unprepared)
    monkeypatch.setitem(SCENARIOS, "storm", storm)
    out = tmp_path / "results.json"
    argv = ["--only", "unprepared", "--only", "storm", "--repeats", "1", "--dir", str(tmp_path)]
    assert bench.main([*argv, "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["scenarios"]["unprepared"]["failed"] == (
        "preparing failed: CatalogGone: the embedded Postgres did not start"
    )
    rows = {r["label"]: r for r in doc["scenarios"]["storm"]["rows"]}
    assert rows["coordinator"]["median"] == 2.0
    assert rows["per-rank"]["failed"].startswith("1 of 1 runs failed: CatalogGone")
    printed = capsys.readouterr().out
    assert "unprepared: a scenario whose services never came up: preparing failed" in printed
    assert "1 of 1 runs failed" in printed


def test_a_part_that_fails_keeps_the_numbers_of_the_runs_other_parts() -> None:
    """The scale scenario's shape: one run measures a checkpoint's costs, then restart storms on
    it; a storm that fails is reported on its own rows, and the costs and the other storm keep
    their numbers."""
    outcomes = iter(
        [
            Outcome(
                {"restorable": 4.0, "storm coordinator p99": 0.2},
                failed={"storm per-rank ": "CatalogGone: 503 catalog_unavailable"},
            ),
            Outcome({"restorable": 6.0, "storm coordinator p99": 0.4, "storm per-rank p99": 0.8}),
        ]
    )
    rows = (
        Row("restorable", "restorable"),
        Row("per-rank p99", "storm per-rank p99"),
        Row("coordinator p99", "storm coordinator p99", baseline="per-rank p99"),
    )
    method = Method("1,000 nodes", lambda: next(outcomes), rows)
    result = summarize(Storm(), [method], run_methods([method], 2, dict))
    found = {r["label"]: r for r in result["rows"]}
    assert found["restorable"]["values"] == [4.0, 6.0] and found["restorable"]["failed"] is None
    assert found["coordinator p99"]["values"] == [0.2, 0.4]
    assert found["coordinator p99"]["failed"] is None
    per_rank = found["per-rank p99"]
    assert per_rank["values"] == [0.8]
    assert per_rank["failed"] == "1 of 2 runs failed: CatalogGone: 503 catalog_unavailable"
    assert found["coordinator p99"]["ratio"] == pytest.approx(0.3 / 0.8)
    assert any_failed({"scale": result})
